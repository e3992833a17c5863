package io.safetensors.spark

import java.io.File
import java.nio.file.Files

import io.safetensors.spark.write.LocalWorkDir
import org.apache.spark.sql.SparkSession
import org.scalatest.BeforeAndAfterAll
import org.scalatest.funsuite.AnyFunSuite

/**
 * The set-up every suite that runs Spark shares: one local session for the whole suite
 * ([[TestSessions.local]] plus [[sparkConf]]) and a temp directory [[base]] for its datasets; both
 * are removed after the suite.
 */
trait SparkSuiteBase extends AnyFunSuite with BeforeAndAfterAll {
  /** The session's application name (also the prefix of [[base]]'s name). */
  protected def appName: String

  /** Configuration on top of [[TestSessions.local]]'s. Read after [[base]] exists, so it may name
   *  paths in it. */
  protected def sparkConf: Seq[(String, String)] = Seq.empty

  protected var spark: SparkSession = _

  /** This suite's temp directory (in java.io.tmpdir), deleted after the suite. */
  protected var base: File = _

  private var counter = 0

  override def beforeAll(): Unit = {
    super.beforeAll()
    base = Files.createTempDirectory(s"$appName-suite").toFile
    spark = TestSessions.local(appName, sparkConf: _*)
  }

  override def afterAll(): Unit = {
    try {
      if (spark != null) spark.stop()
      if (base != null) LocalWorkDir.deleteTree(base)
    } finally super.afterAll()
  }

  /** A new path under [[base]] (not created). */
  protected def freshPath(): String = {
    counter += 1
    new File(base, s"ds$counter").getAbsolutePath
  }

  /** `t` and its causes, joined: what an assertion on an error's message searches. */
  protected def messages(t: Throwable): String =
    Iterator.iterate(t)(_.getCause).takeWhile(_ != null).map(_.toString).mkString(" | ")
}
