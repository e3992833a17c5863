package io.safetensors.spark.jni;

import java.io.IOException;
import java.io.InputStream;
import java.net.URL;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.Objects;
import java.util.Properties;

/**
 * Loads the Rust engine ({@code libsafetensors_spark}) once per class loader (normally once per
 * JVM: driver and every executor) and declares the library-level natives.
 *
 * <p>Loading: the library is read from this jar's resource {@code
 * native/<os>-<arch>/libsafetensors_spark.so} (the jar carries one per entry of {@link
 * #SUPPORTED_PLATFORMS}: linux-x86_64 and linux-aarch64, picked by {@code os.name}/{@code
 * os.arch}; any other platform gets an {@link UnsatisfiedLinkError} naming it and the supported
 * ones, before anything is extracted), copied to a unique temp file
 * in {@code java.io.tmpdir} (deleted on JVM exit) and {@link System#load}ed. A unique file per load
 * avoids "already loaded in another classloader" when several class loaders (e.g. Spark's {@code
 * --jars} loader and a test loader) use the connector. Then the native {@link #version()} must equal
 * this jar's version, otherwise the library is refused.
 *
 * <p>Callers must call {@link #ensureLoaded()} (cheap after the first time) before any native
 * method of this package; it throws an {@link UnsatisfiedLinkError} that names the resource, the
 * platform and carries the original error as its cause. The static initializer also tries once, so
 * that a direct native call works, but it never fails class initialisation (a failed {@code
 * <clinit>} would leave the class unusable for the JVM's lifetime).
 *
 * <p>Failures of {@code System.load} and version mismatches are remembered and re-thrown (they do
 * not change by retrying); failures while extracting (I/O, interruption of the task thread) are
 * retried by the next call.
 */
public final class NativeLib {
  /** Base name of the native library ({@code libsafetensors_spark.so} on Linux). */
  public static final String LIBRARY_NAME = "safetensors_spark";

  /** Resource (next to this class) holding {@code version=<jar version>}. */
  static final String VERSION_RESOURCE = "safetensors-spark.properties";

  /** What {@code selfTest(0)} returns (mirrors {@code SELF_TEST_OK} in rust-core/jni). */
  public static final int SELF_TEST_OK = 0x5AFE;

  /**
   * The platforms this jar carries a native library for ({@code native/<platform>/}), in the
   * order error messages list them. jvm-connector/pom.xml builds and copies one library per entry.
   * (Declared before the static initializer below, which uses it.)
   */
  public static final List<String> SUPPORTED_PLATFORMS =
      Collections.unmodifiableList(Arrays.asList("linux-x86_64", "linux-aarch64"));

  private static final Object LOCK = new Object();
  private static volatile boolean loaded = false;
  /** Guarded by LOCK: a failure that retrying cannot fix. */
  private static UnsatisfiedLinkError permanentFailure = null;
  /** Guarded by LOCK: where the library was loaded from, for diagnostics. */
  private static String loadedFrom = null;

  static {
    try {
      ensureLoaded();
    } catch (Throwable t) {
      // Reported again (with its cause) by ensureLoaded(); never fail class initialisation.
    }
  }

  private NativeLib() {}

  // ------------------------------------------------------------------------------------------
  // Natives (rust-core/jni/src/lib.rs: Java_io_safetensors_spark_jni_NativeLib_*)

  /** Version of the native library (the Rust crate version). */
  public static native String version();

  /**
   * Bytes the Rust engine has allocated and not freed in this JVM (its global allocator counts
   * them; spec/jni.md). Flat over a long run of writes and reads means no native leak.
   */
  public static native long nativeLiveBytes();

  /**
   * Test hook for the JNI error path: 0 returns {@link #SELF_TEST_OK}; 1 throws {@link
   * IllegalArgumentException}; 2 makes Rust panic, which must arrive as {@link
   * SafetensorsException}; any other mode throws {@link IllegalArgumentException}.
   */
  public static native int selfTest(int mode);

  // ------------------------------------------------------------------------------------------
  // Loading

  /** Loads and checks the native library unless already done. Thread-safe and idempotent. */
  public static void ensureLoaded() {
    if (loaded) {
      return;
    }
    synchronized (LOCK) {
      if (loaded) {
        return;
      }
      if (permanentFailure != null) {
        throw rethrow(permanentFailure);
      }
      load();
      loaded = true;
    }
  }

  /** Whether {@link #ensureLoaded()} has succeeded in this class loader. */
  public static boolean isLoaded() {
    return loaded;
  }

  /** The temp file the library was loaded from, or {@code null} if not loaded. */
  public static String loadedFrom() {
    synchronized (LOCK) {
      return loadedFrom;
    }
  }

  // Called with LOCK held.
  private static void load() {
    String osName = System.getProperty("os.name", "");
    String osArch = System.getProperty("os.arch", "");
    String platform = platform(osName, osArch);
    String resource;
    try {
      resource = resourcePathFor(osName, osArch);
    } catch (UnsatisfiedLinkError e) {
      permanentFailure = e; // the platform does not change
      throw e;
    }
    URL url = NativeLib.class.getClassLoader() == null
        ? ClassLoader.getSystemResource(resource)
        : NativeLib.class.getClassLoader().getResource(resource);
    if (url == null) {
      throw new UnsatisfiedLinkError(missingResourceMessage(resource, osName, osArch));
    }

    Path tmp;
    try {
      tmp = extract(url);
    } catch (IOException | RuntimeException e) {
      UnsatisfiedLinkError err = new UnsatisfiedLinkError(
          "safetensors-spark: cannot extract native library resource '" + resource
              + "' (platform " + platform + ") to java.io.tmpdir="
              + System.getProperty("java.io.tmpdir") + ": " + e);
      err.initCause(e);
      throw err; // not remembered: may work next time
    }

    try {
      System.load(tmp.toAbsolutePath().toString());
    } catch (UnsatisfiedLinkError | SecurityException e) {
      deleteQuietly(tmp);
      UnsatisfiedLinkError err = new UnsatisfiedLinkError(
          "safetensors-spark: cannot load native library resource '" + resource + "' (platform "
              + platform + ", extracted to " + tmp + "): " + e);
      err.initCause(e);
      permanentFailure = err;
      throw err;
    }

    String expected;
    String actual;
    try {
      expected = jarVersion();
      actual = version();
      checkVersion(expected, actual, resource);
    } catch (UnsatisfiedLinkError e) {
      permanentFailure = e;
      throw e;
    } catch (RuntimeException e) {
      UnsatisfiedLinkError err = new UnsatisfiedLinkError(
          "safetensors-spark: native library '" + resource + "' (platform " + platform
              + ") loaded but its version check failed: " + e);
      err.initCause(e);
      permanentFailure = err;
      throw err;
    }
    loadedFrom = tmp.toString();
  }

  private static Path extract(URL url) throws IOException {
    Path dir = Paths.get(System.getProperty("java.io.tmpdir"));
    Path tmp = Files.createTempFile(dir, "libsafetensors_spark-", "-lib" + LIBRARY_NAME + ".so");
    tmp.toFile().deleteOnExit();
    try (InputStream in = url.openStream()) {
      Files.copy(in, tmp, StandardCopyOption.REPLACE_EXISTING);
    } catch (IOException | RuntimeException e) {
      deleteQuietly(tmp);
      throw e;
    }
    return tmp;
  }

  private static void deleteQuietly(Path p) {
    try {
      Files.deleteIfExists(p);
    } catch (IOException | RuntimeException ignored) {
      // deleteOnExit() is registered as well
    }
  }

  /** A fresh error (this thread's stack) caused by the remembered one. */
  private static UnsatisfiedLinkError rethrow(UnsatisfiedLinkError remembered) {
    UnsatisfiedLinkError err = new UnsatisfiedLinkError(remembered.getMessage());
    err.initCause(remembered);
    return err;
  }

  // ------------------------------------------------------------------------------------------
  // Pure helpers (unit-tested)

  /**
   * Refuses a native library whose version differs from the jar's.
   *
   * @throws UnsatisfiedLinkError naming both versions
   */
  public static void checkVersion(String jarVersion, String nativeVersion, String origin) {
    Objects.requireNonNull(jarVersion, "jarVersion");
    if (!jarVersion.equals(nativeVersion)) {
      throw new UnsatisfiedLinkError(
          "safetensors-spark: version mismatch: the jar is " + jarVersion
              + " but the native library '" + origin + "' is " + nativeVersion
              + "; rebuild the jar so that both come from the same build");
    }
  }

  /** The jar's version, from the filtered {@value #VERSION_RESOURCE} next to this class. */
  public static String jarVersion() {
    try (InputStream in = NativeLib.class.getResourceAsStream(VERSION_RESOURCE)) {
      if (in == null) {
        throw new IllegalStateException(
            "resource " + VERSION_RESOURCE + " missing next to " + NativeLib.class.getName());
      }
      Properties p = new Properties();
      p.load(in);
      String v = p.getProperty("version");
      if (v == null || v.isEmpty() || v.startsWith("${")) {
        throw new IllegalStateException(
            "resource " + VERSION_RESOURCE + " has no filtered 'version' (got " + v + ")");
      }
      return v.trim();
    } catch (IOException e) {
      throw new IllegalStateException("cannot read " + VERSION_RESOURCE + ": " + e, e);
    }
  }

  /** {@code <os>-<arch>} of this JVM, e.g. {@code linux-x86_64}. */
  public static String platform() {
    return platform(System.getProperty("os.name", ""), System.getProperty("os.arch", ""));
  }

  /** {@code <os>-<arch>} for the given {@code os.name} and {@code os.arch}. */
  public static String platform(String osName, String osArch) {
    return normalizeOs(osName) + "-" + normalizeArch(osArch);
  }

  /** Resource path of the library for this JVM's platform (see {@link #resourcePathFor}). */
  public static String resourcePath() {
    return resourcePathFor(System.getProperty("os.name", ""), System.getProperty("os.arch", ""));
  }

  /**
   * Resource path of the library for the platform of {@code os.name}/{@code os.arch}, e.g. {@code
   * native/linux-aarch64/libsafetensors_spark.so}.
   *
   * @throws UnsatisfiedLinkError when the platform is not one of {@link #SUPPORTED_PLATFORMS}; the
   *     message names the platform, the two properties and the supported platforms
   */
  public static String resourcePathFor(String osName, String osArch) {
    String platform = platform(osName, osArch);
    if (!SUPPORTED_PLATFORMS.contains(platform)) {
      throw new UnsatisfiedLinkError(
          "safetensors-spark: unsupported platform " + platform + " (os.name=" + osName
              + ", os.arch=" + osArch + "): the jar has a native library for "
              + String.join(", ", SUPPORTED_PLATFORMS) + " only");
    }
    // every supported platform is Linux: lib<name>.so whatever the JVM that asks
    return "native/" + platform + "/lib" + LIBRARY_NAME + ".so";
  }

  /** The message for a supported platform whose library is not in the jar (a partial build). */
  public static String missingResourceMessage(String resource, String osName, String osArch) {
    return "safetensors-spark: no native library for platform " + platform(osName, osArch)
        + " in this jar: resource '" + resource + "' is missing (os.name=" + osName + ", os.arch="
        + osArch + "); the jar was built without it (a full build bundles "
        + String.join(", ", SUPPORTED_PLATFORMS) + ")";
  }

  /** linux / macos / windows; otherwise the lower-cased name without spaces. */
  public static String normalizeOs(String osName) {
    String os = osName.toLowerCase(Locale.ROOT).trim();
    if (os.startsWith("linux")) {
      return "linux";
    }
    if (os.startsWith("mac") || os.startsWith("darwin")) {
      return "macos";
    }
    if (os.startsWith("windows")) {
      return "windows";
    }
    return os.replaceAll("[^a-z0-9]+", "");
  }

  /** amd64/x86_64/x64 → x86_64, aarch64/arm64 → aarch64; otherwise the lower-cased name. */
  public static String normalizeArch(String osArch) {
    String arch = osArch.toLowerCase(Locale.ROOT).trim();
    switch (arch) {
      case "amd64":
      case "x86_64":
      case "x86-64":
      case "x64":
        return "x86_64";
      case "aarch64":
      case "arm64":
        return "aarch64";
      default:
        return arch.replaceAll("[^a-z0-9_]+", "");
    }
  }
}
