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

  test("class initialisation alone loads the library (a direct native call works)") {
    // a fresh class loader: NativeLib's static initializer runs there, nothing else is called
    val location = classOf[NativeLib].getProtectionDomain.getCodeSource.getLocation
    val child = new URLClassLoader(Array(location), ClassLoader.getPlatformClassLoader)
    try {
      val cls = Class.forName("io.safetensors.spark.jni.NativeLib", true, child)
      assert(cls.getMethod("isLoaded").invoke(null) == true, "the static initializer did not load it")
      assert(cls.getMethod("selfTest", classOf[Int]).invoke(null, Int.box(0)) == NativeLib.SELF_TEST_OK)
    } finally child.close()
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

  test("resourcePathFor picks the library by os.name/os.arch for each supported platform") {
    assert(NativeLib.SUPPORTED_PLATFORMS.asScala == Seq("linux-x86_64", "linux-aarch64"))
    for (arch <- Seq("amd64", "x86_64", "X86_64")) {
      assert(NativeLib.resourcePathFor("Linux", arch) == "native/linux-x86_64/libsafetensors_spark.so")
    }
    for (arch <- Seq("aarch64", "arm64")) {
      assert(NativeLib.resourcePathFor("Linux", arch) == "native/linux-aarch64/libsafetensors_spark.so")
    }
    assert(NativeLib.platform("Linux", "aarch64") == "linux-aarch64")
  }

  test("an unsupported platform gets an error naming it, its properties and the supported ones") {
    val cases = Seq(
      ("Mac OS X", "aarch64", "macos-aarch64"),
      ("Windows 11", "amd64", "windows-x86_64"),
      ("Linux", "ppc64le", "linux-ppc64le"),
      ("Linux", "s390x", "linux-s390x"),
      ("Linux", "arm", "linux-arm"), // 32-bit ARM: not aarch64
      ("Linux", "riscv64", "linux-riscv64"),
      ("FreeBSD", "amd64", "freebsd-x86_64"),
      ("", "", "-"))
    for ((os, arch, platform) <- cases) {
      val e = intercept[UnsatisfiedLinkError](NativeLib.resourcePathFor(os, arch))
      val m = e.getMessage
      assert(m.startsWith(s"safetensors-spark: unsupported platform $platform "), m)
      assert(m.contains(s"os.name=$os, os.arch=$arch"), m)
      assert(m.contains("linux-x86_64, linux-aarch64"), m)
    }
  }

  test("a supported platform whose library is missing from the jar is named as a partial build") {
    val m = NativeLib.missingResourceMessage(
      "native/linux-aarch64/libsafetensors_spark.so", "Linux", "aarch64")
    assert(m.contains("no native library for platform linux-aarch64"), m)
    assert(m.contains("'native/linux-aarch64/libsafetensors_spark.so' is missing"), m)
    assert(m.contains("os.name=Linux, os.arch=aarch64"), m)
    assert(m.contains("linux-x86_64, linux-aarch64"), m)
  }

  test("the classpath carries an ELF library for every supported platform, for its machine") {
    // what the build copied to target/classes (and the shade plugin into the jar): a 64-bit
    // little-endian shared object whose e_machine matches the folder (EM_X86_64 62, EM_AARCH64 183)
    val machines = Map("linux-x86_64" -> 62, "linux-aarch64" -> 183)
    for (platform <- NativeLib.SUPPORTED_PLATFORMS.asScala) {
      val resource = s"native/$platform/libsafetensors_spark.so"
      val in = getClass.getClassLoader.getResourceAsStream(resource)
      assert(in != null, s"$resource is not on the classpath")
      val head = try in.readNBytes(20) finally in.close()
      assert(head.length == 20 && head.take(4).sameElements(Array[Byte](0x7f, 'E', 'L', 'F')), resource)
      assert(head(4) == 2 && head(5) == 1, s"$resource: not ELFCLASS64 little-endian")
      assert(head(16) == 3, s"$resource: e_type ${head(16)} is not ET_DYN")
      val machine = (head(18) & 0xff) | ((head(19) & 0xff) << 8)
      assert(machine == machines(platform), s"$resource: e_machine $machine")
    }
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
