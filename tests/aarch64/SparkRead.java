import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;

/**
 * spark.read.format("safetensors") of datasets written on x86_64, in a local[1] Spark on whatever
 * JVM runs this class: tests/aarch64/run.sh (step spark) runs it on the x86_64 JVM and on an
 * aarch64 JVM under qemu-aarch64 (so the connector loads native/linux-aarch64/) and diffs the two
 * outputs: per dataset the schema, the row count, a SHA-256 over the sorted rows as JSON, 3 rows.
 * Usage: java -cp JAR:SPARK_JARS/*:DIR SparkRead DATASET_DIR...
 */
public final class SparkRead {
  public static void main(String[] args) throws Exception {
    SparkSession spark = SparkSession.builder().master("local[1]").appName("aarch64-read")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
        .getOrCreate();
    spark.sparkContext().setLogLevel("ERROR");
    try {
      for (String dir : args) {
        Dataset<Row> df = spark.read().format("safetensors").load(dir);
        // JSON: binary (a tensor's bytes) as base64, floats by Jackson, the same text on any JVM
        List<String> rows = new ArrayList<>(df.toJSON().collectAsList());
        Collections.sort(rows);
        MessageDigest sha = MessageDigest.getInstance("SHA-256");
        for (String r : rows) {
          sha.update(r.getBytes("UTF-8"));
          sha.update((byte) '\n');
        }
        StringBuilder hex = new StringBuilder();
        for (byte b : sha.digest()) {
          hex.append(String.format("%02x", b));
        }
        String name = dir.replaceAll(".*/", "");
        System.out.println(name + " schema " + df.schema().simpleString());
        System.out.println(name + " rows " + rows.size() + " sha256 " + hex);
        for (int i = 0; i < Math.min(3, rows.size()); i++) {
          System.out.println(name + " row " + rows.get(i));
        }
      }
    } finally {
      spark.stop();
    }
  }
}
