package io.safetensors.spark

import java.net.URLClassLoader
import java.util.concurrent.{Callable, Executors, TimeUnit}

import scala.jdk.CollectionConverters._

import io.safetensors.spark.jni.{NativeLib, SafetensorsException}
import org.scalatest.funsuite.AnyFunSuite

/** Loading the Rust library through NativeLib and the JNI error path (no Spark). */
class NativeLibSuite extends AnyFunSuite {

  test("ensureLoaded loads the library from the classpath resource, idempotently") {
    NativeLib.ensureLoaded()
    assert(NativeLib.isLoaded)
    val from = NativeLib.loadedFrom()
    assert(from != null && from.contains("libsafetensors_spark-"), from)
    NativeLib.ensureLoaded()
    assert(NativeLib.loadedFrom() == from, "a second call must not load again")
  }

  test("concurrent ensureLoaded calls agree") {
    val pool = Executors.newFixedThreadPool(8)
    try {
      val calls = (1 to 16).map { _ =>
        new Callable[String] {
          def call(): String = { NativeLib.ensureLoaded(); NativeLib.version() }
        }
      }
      val results = pool.invokeAll(calls.asJava).asScala.map(_.get(60, TimeUnit.SECONDS))
      assert(results.toSet == Set(TestVersions.pomVersion))
    } finally pool.shutdownNow()
  }

  test("native version() equals the pom version and the jar resource version") {
    NativeLib.ensureLoaded()
    assert(NativeLib.version() == TestVersions.pomVersion)
    assert(NativeLib.jarVersion() == TestVersions.pomVersion)
  }

  test("selfTest(0) returns normally") {
    NativeLib.ensureLoaded()
    assert(NativeLib.selfTest(0) == NativeLib.SELF_TEST_OK)
  }

  test("selfTest(1): a Rust InvalidArgument error arrives as IllegalArgumentException") {
    NativeLib.ensureLoaded()
    val e = intercept[IllegalArgumentException](NativeLib.selfTest(1))
    assert(e.getClass == classOf[IllegalArgumentException])
    assert(e.getMessage == "selfTest: invalid argument requested (mode 1)")
    val unknown = intercept[IllegalArgumentException](NativeLib.selfTest(99))
    assert(unknown.getMessage.contains("unknown mode 99"))
  }

  test("selfTest(2): a Rust panic arrives as SafetensorsException and the JVM survives") {
    NativeLib.ensureLoaded()
    val e = intercept[SafetensorsException](NativeLib.selfTest(2))
    assert(e.getMessage == "internal error (Rust panic): selfTest: panic requested (mode 2)")
    // The library keeps working after the panic, repeatedly.
    for (_ <- 1 to 3) {
      intercept[SafetensorsException](NativeLib.selfTest(2))
      assert(NativeLib.selfTest(0) == NativeLib.SELF_TEST_OK)
      assert(NativeLib.version() == TestVersions.pomVersion)
    }
  }

  test("a second class loader (like Spark's --jars loader) loads its own copy and throws its own classes") {
    NativeLib.ensureLoaded()
    val location = classOf[NativeLib].getProtectionDomain.getCodeSource.getLocation
    // Parent = platform loader: the child cannot see the test classpath's copy of our classes.
    val child = new URLClassLoader(Array(location), ClassLoader.getPlatformClassLoader)
    try {
      val cls = Class.forName("io.safetensors.spark.jni.NativeLib", true, child)
      assert(cls ne classOf[NativeLib])
      cls.getMethod("ensureLoaded").invoke(null)
      assert(cls.getMethod("version").invoke(null) == TestVersions.pomVersion)
      val childFrom = cls.getMethod("loadedFrom").invoke(null).asInstanceOf[String]
      assert(childFrom != NativeLib.loadedFrom(), "each class loader extracts its own temp file")

      val selfTest = cls.getMethod("selfTest", classOf[Int])
      val thrown = intercept[java.lang.reflect.InvocationTargetException] {
        selfTest.invoke(null, Int.box(2))
      }.getCause
      // JNI FindClass resolves through the loader that defined NativeLib, not the context loader.
      assert(thrown.getClass.getName == "io.safetensors.spark.jni.SafetensorsException")
      assert(thrown.getClass.getClassLoader eq child)
      assert(!thrown.isInstanceOf[SafetensorsException], "must be the child's class, not ours")
    } finally child.close()
  }
}

/** Pure checks of the version rules (no native code involved in the assertions). */
class VersionCheckSuite extends AnyFunSuite {

  test("checkVersion accepts equal versions") {
    NativeLib.checkVersion("0.1.0", "0.1.0", "native/linux-x86_64/libsafetensors_spark.so")
  }

  test("checkVersion refuses a different native version and names both") {
    val e = intercept[UnsatisfiedLinkError] {
      NativeLib.checkVersion("0.1.0", "0.2.0", "native/linux-x86_64/libsafetensors_spark.so")
    }
    assert(e.getMessage.contains("version mismatch"))
    assert(e.getMessage.contains("0.1.0") && e.getMessage.contains("0.2.0"))
    assert(e.getMessage.contains("native/linux-x86_64/libsafetensors_spark.so"))
    intercept[UnsatisfiedLinkError](NativeLib.checkVersion("0.1.0", null, "x"))
    intercept[UnsatisfiedLinkError](NativeLib.checkVersion("0.1.0", "0.1.0-SNAPSHOT", "x"))
  }

  test("os/arch normalisation") {
    assert(NativeLib.normalizeArch("amd64") == "x86_64")
    assert(NativeLib.normalizeArch("x86_64") == "x86_64")
    assert(NativeLib.normalizeArch("aarch64") == "aarch64")
    assert(NativeLib.normalizeArch("arm64") == "aarch64")
    assert(NativeLib.normalizeOs("Linux") == "linux")
    assert(NativeLib.normalizeOs("Mac OS X") == "macos")
    assert(NativeLib.normalizeOs("Windows 11") == "windows")
  }

  test("pom version == Cargo workspace version == jar resource version") {
    assert(TestVersions.cargoWorkspaceVersion == TestVersions.pomVersion,
      "jvm-connector/pom.xml <version> must equal [workspace.package] version in Cargo.toml")
    assert(NativeLib.jarVersion() == TestVersions.pomVersion)
  }
}

object TestVersions {
  /** Set by scalatest-maven-plugin; falls back to the filtered jar resource. */
  lazy val pomVersion: String =
    Option(System.getProperty("safetensors.pom.version")).getOrElse(NativeLib.jarVersion())

  /** `version = "..."` of `[workspace.package]` in the repo root's Cargo.toml. */
  lazy val cargoWorkspaceVersion: String = {
    val root = Option(System.getProperty("safetensors.repo.root")).getOrElse("..")
    val src = scala.io.Source.fromFile(new java.io.File(root, "Cargo.toml"), "UTF-8")
    val lines = try src.getLines().toList finally src.close()
    val section = lines.dropWhile(_.trim != "[workspace.package]").drop(1)
      .takeWhile(l => !l.trim.startsWith("["))
    val Version = """\s*version\s*=\s*"([^"]+)"\s*""".r
    section.collectFirst { case Version(v) => v }
      .getOrElse(fail(s"no version in [workspace.package] of $root/Cargo.toml"))
  }

  private def fail(msg: String): Nothing = throw new IllegalStateException(msg)
}
