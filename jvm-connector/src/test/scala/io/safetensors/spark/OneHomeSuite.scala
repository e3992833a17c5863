package io.safetensors.spark

import java.io.File
import java.nio.charset.StandardCharsets
import java.nio.file.Files

import io.safetensors.spark.commit.DatasetCommit
import io.safetensors.spark.files.DatasetFiles
import io.safetensors.spark.jni.{NativeNames, NativeReader, NativeWriter, SafetensorsDatasetException,
  SafetensorsOptionsException}
import org.scalatest.funsuite.AnyFunSuite

/**
 * Dataset rules live once, in Rust (issue 42): the connector builds and parses the dataset's names,
 * the `layout` read option's values, the KV key column and the commit bound through the JNI. A
 * copy that comes back as a literal in the main sources fails here; the JVM paths are checked to
 * refuse what the Rust rule refuses. (No Spark.)
 */
class OneHomeSuite extends AnyFunSuite {

  private val mainSources: Seq[File] = {
    val root = new File(sys.props.getOrElse("basedir", "."), "src/main")
    def walk(f: File): Seq[File] =
      if (f.isDirectory) Option(f.listFiles()).toSeq.flatten.sortBy(_.getName).flatMap(walk)
      else if (f.getName.endsWith(".scala") || f.getName.endsWith(".java")) Seq(f) else Seq.empty
    walk(root)
  }

  /** The string literals of a Scala/Java source, comments removed first. */
  private def literals(source: String): Seq[String] = {
    val noBlock = source.replaceAll("(?s)/\\*.*?\\*/", " ")
    val noLine = noBlock.linesIterator.map(_.replaceAll("^\\s*//.*$", "").replaceAll("\\s//[^\"]*$", ""))
      .mkString("\n")
    "\"((?:[^\"\\\\\\n]|\\\\.)*)\"".r.findAllMatchIn(noLine).map(_.group(1)).toSeq
  }

  test("no main source holds a literal copy of a dataset name, the log or index part name, or the layouts") {
    assert(mainSources.size > 40, mainSources.map(_.getPath))
    val copies = mainSources.flatMap { f =>
      val text = new String(Files.readAllBytes(f.toPath), StandardCharsets.UTF_8)
      val names = literals(text).filter { l =>
        Seq("dataset_manifest.json", "_manifest_log", "_tensor_index.parquet", "%020d", "part-[0-9]",
          ".safetensors").exists(l.contains)
      }
      // the read layouts listed as literals (the engine's RowLayoutOption is their home)
      val layouts = if (literals(text).containsSlice(Seq("sample", "tensor", "file"))) Seq("sample, tensor, file")
        else Seq.empty
      (names ++ layouts).map(l => s"${f.getName}: \"$l\"")
    }
    assert(copies.isEmpty, s"literal copies of Rust dataset rules (use NativeNames): $copies")
  }

  test("the JVM's names are Rust's, and a name the Rust rule refuses is refused here") {
    assert(DatasetFiles.ManifestName == "dataset_manifest.json" && DatasetCommit.LogDir == "_manifest_log")
    assert(DatasetFiles.IndexDir == "_tensor_index.parquet" && DatasetFiles.Extension == ".safetensors")
    assert(DatasetCommit.logName(7) == "00000000000000000007.json")
    assert(DatasetCommit.parseLogName(DatasetCommit.logName(Long.MaxValue)).contains(Long.MaxValue))
    assert(DatasetCommit.parseLogName(".00000000000000000007.json.x.tmp").isEmpty)
    // one past the largest version: no version, and never skipped silently
    for (stray <- Seq("09223372036854775808.json", "99999999999999999999.json")) {
      val e = intercept[SafetensorsDatasetException](DatasetCommit.parseLogName(stray))
      assert(e.getMessage.contains(s"_manifest_log/$stray: not a version number (at most ${Long.MaxValue})"),
        e.getMessage)
    }
    intercept[IllegalArgumentException](DatasetCommit.logName(-1))
    assert(DatasetCommit.parseIndexPartName("part-00000000000000000042.parquet").contains(42L))
    assert(DatasetCommit.parseIndexPartName("part-00000.parquet").isEmpty)
    assert(DatasetFiles.isHidden("_x.safetensors") && !DatasetFiles.isShardName("_x.safetensors"))
    assert(DatasetFiles.isShardName("model-00001-of-00002.safetensors"))
    assert(DatasetCommit.MaxCommitAttempts == 100)
    intercept[IllegalArgumentException](NativeNames.constant("NOPE"))
  }

  test("rewritten shards of one commit never share a name, and keep their partition") {
    val a = "part-00003-0000-550e8400-e29b-41d4-a716-446655440000.safetensors"
    val b = "part-00003-0000-650e8400-e29b-41d4-a716-446655440000.safetensors"
    val copy = "750e8400-e29b-41d4-a716-446655440000"
    val (ca, cb) = (NativeNames.rewrittenShardFileName(a, 0, copy), NativeNames.rewrittenShardFileName(b, 1, copy))
    assert(ca != cb && NativeNames.shardFilePartition(ca) == 3 && NativeNames.shardFilePartition(cb) == 3)
    assert(NativeNames.shardFilePartition("model-00001-of-00002.safetensors") == -1)
  }

  test("the layout option and the KV key column are the engine's rules") {
    assert(NativeReader.layoutOption(" Sample ") == "sample")
    assert(NativeReader.layoutOptionNames() == "auto, sample, tensor, file")
    val e = intercept[SafetensorsOptionsException](NativeReader.layoutOption("rows"))
    assert(e.getMessage.contains("option 'layout' must be one of auto, sample, tensor, file, got 'rows'"))
    assert(NativeWriter.kvKeyColumn("[\"emb\",\"id\"]", "[\"emb\"]") == "id")
    val two = intercept[SafetensorsOptionsException](NativeWriter.kvKeyColumn("[\"a\",\"b\"]", "[\"emb\"]"))
    assert(two.getMessage.contains("but the table has 'a', 'b'"), two.getMessage)
  }
}
