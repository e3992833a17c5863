package io.safetensors.spark.commit

import java.io.IOException

import org.apache.hadoop.fs.{FileSystem, Path}
import org.apache.hadoop.fs.s3a.S3AFileSystem
import software.amazon.awssdk.awscore.AwsRequestOverrideConfiguration
import software.amazon.awssdk.core.sync.RequestBody
import software.amazon.awssdk.services.s3.model.{PutObjectRequest, S3Exception}

/**
 * Create-if-absent of one small object on S3 through S3A (spec/dataset.md §5.3 step 3): a PutObject
 * with `If-None-Match: *`, sent with the AWS SDK v2 client S3A holds (Hadoop 3.4.1's S3A has no
 * conditional create of its own). S3 answers 412 when the key exists, so of two writers creating
 * one manifest version exactly one succeeds. Loaded only for an `S3AFileSystem` (hadoop-aws and the
 * SDK are the user's, like every S3A dependency).
 */
private[spark] object S3ConditionalCreate {
  /** Retries of a 409 ConditionalRequestConflict (another conditional write to the key in flight). */
  private val ConflictRetries = 10

  /** True when `path` was created with `bytes`; false when an object already had that name. */
  def createIfAbsent(fs: FileSystem, path: Path, bytes: Array[Byte]): Boolean = {
    val s3a = fs.asInstanceOf[S3AFileSystem]
    val client = s3a.getS3AInternals.getAmazonS3Client("safetensors: conditional create of a manifest version")
    val request = PutObjectRequest.builder()
      .bucket(s3a.getBucket)
      .key(s3a.pathToKey(s3a.makeQualified(path)))
      .contentLength(bytes.length.toLong)
      .overrideConfiguration(AwsRequestOverrideConfiguration.builder().putHeader("If-None-Match", "*").build())
      .build()
    var attempt = 0
    var result: Option[Boolean] = None
    while (result.isEmpty) {
      try {
        client.putObject(request, RequestBody.fromBytes(bytes))
        result = Some(true)
      } catch {
        case e: S3Exception if e.statusCode() == 412 => result = Some(false)
        case e: S3Exception if e.statusCode() == 409 && attempt < ConflictRetries =>
          attempt += 1
          Thread.sleep(50L * attempt)
        case e: S3Exception =>
          throw new IOException(s"safetensors: conditional create of $path failed: ${e.getMessage}", e)
      }
    }
    result.get
  }
}
