import io.safetensors.spark.jni.NativeLib;
import io.safetensors.spark.jni.NativeReader;
import io.safetensors.spark.jni.NativeTensors;
import io.safetensors.spark.jni.SafetensorsException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.List;

/**
 * The connector jar's native library exercised through JNI on whatever JVM runs this class: run by
 * tests/aarch64/run.sh on the host's x86_64 JVM and on an aarch64 JVM under qemu-aarch64, and the
 * two outputs (stdout) are diffed. Usage: java -cp JAR:DIR JarSmoke EXPECTED_PLATFORM [FILE...]
 * where EXPECTED_PLATFORM is the native/<platform>/ folder this JVM must load from, and each FILE
 * is a safetensors file whose header is validated and whose tensors are decoded. Exit 1 on a
 * failed check (the message on stderr).
 */
public final class JarSmoke {
  private static final List<String> OUT = new ArrayList<>();

  private static void check(boolean ok, String what) {
    if (!ok) {
      throw new AssertionError("JarSmoke: " + what);
    }
  }

  private static String sha(byte[] bytes) throws Exception {
    StringBuilder s = new StringBuilder();
    for (byte b : MessageDigest.getInstance("SHA-256").digest(bytes)) {
      s.append(String.format("%02x", b));
    }
    return s.toString();
  }

  public static void main(String[] args) throws Exception {
    String expected = args[0];
    // 1. the loader picks the library by os.arch
    check(NativeLib.platform().equals(expected),
        "platform " + NativeLib.platform() + " != expected " + expected);
    // (on a platform the jar has no library for, this throws the UnsatisfiedLinkError naming it)
    NativeLib.ensureLoaded();
    check(NativeLib.resourcePath().equals("native/" + expected + "/libsafetensors_spark.so"),
        "resource " + NativeLib.resourcePath());
    System.err.println("JarSmoke: loaded " + NativeLib.resourcePath() + " from "
        + NativeLib.loadedFrom() + " (os.arch=" + System.getProperty("os.arch") + ")");
    OUT.add("version " + NativeLib.version());
    check(NativeLib.version().equals(NativeLib.jarVersion()), "version != jar version");
    // 2. the JNI error path: a Rust error and a Rust panic arrive as Java exceptions
    OUT.add("selfTest(0) " + Integer.toHexString(NativeLib.selfTest(0)));
    try {
      NativeLib.selfTest(1);
      check(false, "selfTest(1) did not throw");
    } catch (IllegalArgumentException e) {
      OUT.add("selfTest(1) " + e.getClass().getSimpleName() + ": " + e.getMessage());
    }
    try {
      NativeLib.selfTest(2);
      check(false, "selfTest(2) did not throw");
    } catch (SafetensorsException e) {
      OUT.add("selfTest(2) " + e.getClass().getSimpleName() + ": " + e.getMessage());
    }
    // 3. conversions through JNI (the writer's arr_to_st and the reader's st_to_array)
    int n = 4099;
    ByteBuffer doubles = ByteBuffer.allocate(8 * n).order(ByteOrder.LITTLE_ENDIAN);
    ByteBuffer longs = ByteBuffer.allocate(8 * n).order(ByteOrder.LITTLE_ENDIAN);
    long x = 0x0123456789abcdefL;
    for (int i = 0; i < n; i++) {
      x ^= x >>> 12; x ^= x << 25; x ^= x >>> 27;
      long r = x * 0x2545F4914F6CDD1DL;
      doubles.putDouble(i % 3 == 0 ? Double.longBitsToDouble(r) : (r % 100000) / 7.0);
      longs.putLong(i % 2 == 0 ? r : r % 100);
    }
    String[][] encodes = {
      {"double", "F64"}, {"double", "F32"}, {"double", "F16"}, {"double", "BF16"},
      {"long", "I64"}, {"long", "F32"}, {"long", "BF16"}, {"long", "I8"},
    };
    for (String[] e : encodes) {
      byte[] values = e[0].equals("double") ? doubles.array() : longs.array();
      try {
        byte[] enc = NativeTensors.encode(values, e[0], e[1], new long[] {n});
        OUT.add("encode " + e[0] + "->" + e[1] + " " + sha(enc));
        String back = NativeTensors.elementType(e[1]);
        byte[] dec = NativeTensors.decode(enc, e[1], new long[] {n}, back);
        OUT.add("decode " + e[1] + "->" + back + " " + sha(dec));
      } catch (IllegalArgumentException err) {
        OUT.add("encode " + e[0] + "->" + e[1] + " error: " + err.getMessage());
      }
    }
    // 4. files written elsewhere (on x86_64): header validation and every tensor decoded
    for (int i = 1; i < args.length; i++) {
      Path file = Paths.get(args[i]);
      byte[] bytes = Files.readAllBytes(file);
      long headerLen = NativeReader.headerLength(
          file.toString(), java.util.Arrays.copyOf(bytes, Math.min(8, bytes.length)), bytes.length);
      byte[] head = java.util.Arrays.copyOf(bytes, (int) (8 + headerLen));
      String header = NativeReader.validatedHeader(file.toString(), head, bytes.length);
      OUT.add("file " + file.getFileName() + " header " + headerLen + " " + sha(header.getBytes("UTF-8")));
    }
    for (String line : OUT) {
      System.out.println(line);
    }
  }
}
