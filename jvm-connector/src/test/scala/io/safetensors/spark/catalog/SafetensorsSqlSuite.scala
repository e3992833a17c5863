package io.safetensors.spark.catalog

import java.io.File
import java.nio.{ByteBuffer, ByteOrder}

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.{DataFrame, Row, SaveMode}
import org.apache.spark.sql.catalyst.TableIdentifier
import org.apache.spark.sql.types._
import io.safetensors.spark.{SafetensorsExtensions, SparkSuiteBase}
import io.safetensors.spark.files.DatasetFiles
import io.safetensors.spark.write.SafetensorsWriteSuite

/**
 * SQL and catalog tables (spec/sql.md): SQL on files through the extensions class, CREATE TABLE
 * (external and managed) with SELECT / DESCRIBE, INSERT INTO / OVERWRITE, saveAsTable, writeTo,
 * table options, and that `save(path)` keeps every SaveMode. A Hive-less in-memory catalog with
 * its warehouse under this suite's temp directory.
 */
class SafetensorsSqlSuite extends SparkSuiteBase {
  import SafetensorsWriteSuite.{manifest, readShard, shardFiles}

  private def warehouse: File = new File(base, "warehouse")

  override protected def appName: String = "safetensors-sql"

  override protected def sparkConf: Seq[(String, String)] = Seq(
    "spark.sql.extensions" -> classOf[SafetensorsExtensions].getName,
    "spark.sql.warehouse.dir" -> warehouse.getAbsolutePath,
    "spark.sql.catalogImplementation" -> "in-memory")

  private def sql(q: String): DataFrame = spark.sql(q)

  private def withTable(names: String*)(body: => Unit): Unit =
    try body finally names.foreach(n => sql(s"DROP TABLE IF EXISTS $n"))

  /** `n` rows `(id: long, x: array<float> = [id, id + 0.5])`. */
  private def rows(n: Int, from: Int = 0): DataFrame = {
    val schema = StructType(Seq(StructField("id", LongType), StructField("x", ArrayType(FloatType))))
    val data = (from until from + n).map(i => Row(i.toLong, Seq(i.toFloat, i + 0.5f)))
    spark.createDataFrame(spark.sparkContext.parallelize(data, 2), schema)
  }

  /** The shards the dataset's manifest lists (an overwrite's superseded shards stay on disk for
   *  older versions until a vacuum, spec/dataset.md §5.8.1). */
  private def listedShards(path: String): Seq[File] =
    if (!new File(path, DatasetFiles.ManifestName).exists()) Seq.empty
    else manifest(path).get("shards").elements().asScala.map(s => new File(path, s.get("shard_path").asText())).toSeq

  /** Every sample the dataset lists as (id, x), read from its shards themselves, sorted by id. */
  private def onDisk(path: String): Seq[(Long, Seq[Float])] =
    listedShards(path).flatMap { f =>
      val st = readShard(f)
      val ids = ByteBuffer.wrap(st.tensor("id").data).order(ByteOrder.LITTLE_ENDIAN).asLongBuffer()
      val xs = ByteBuffer.wrap(st.tensor("x").data).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer()
      Seq.fill(ids.remaining())(ids.get() -> Seq(xs.get(), xs.get()))
    }.sortBy(_._1)

  private def expected(ids: Range): Seq[(Long, Seq[Float])] =
    ids.map(i => i.toLong -> Seq(i.toFloat, i + 0.5f))

  private def selected(df: DataFrame): Seq[(Long, Seq[Float])] =
    df.collect().map(r => r.getLong(0) -> r.getSeq[Float](1)).toSeq.sortBy(_._1)

  test("SELECT FROM safetensors.`path`: the rows, filters, count, and options via the read path") {
    val path = freshPath()
    rows(5).write.format("safetensors").option("batch_size", "2").save(path)
    assert(selected(sql(s"SELECT id, x FROM safetensors.`$path`")) == expected(0 until 5))
    assert(sql(s"SELECT count(*) FROM safetensors.`$path`").head().getLong(0) == 5)
    assert(sql(s"SELECT id FROM safetensors.`$path` WHERE id >= 3 ORDER BY id").collect()
      .map(_.getLong(0)).toSeq == Seq(3L, 4L))
    // a join of the path with itself, in a subquery
    assert(sql(s"SELECT count(*) FROM safetensors.`$path` a JOIN " +
      s"(SELECT id FROM safetensors.`$path` WHERE id < 2) b ON a.id = b.id").head().getLong(0) == 2)
    // read options in Spark's WITH clause
    val tensors = sql(s"SELECT * FROM safetensors.`$path` WITH ('layout' = 'tensor')")
    assert(tensors.columns.contains("key"))
    assert(tensors.count() == spark.read.format("safetensors").option("layout", "tensor").load(path).count())
    assert(tensors.count() == 2L * shardFiles(path).size)
    // the same errors as load(path)
    val missing = intercept[Exception](sql(s"SELECT * FROM safetensors.`${path}_nope`").collect())
    assert(messages(missing).contains("path does not exist"), messages(missing))
  }

  test("SQL on files: off with spark.sql.runSQLOnFiles=false; a real table of that name wins") {
    val path = freshPath()
    rows(3).write.format("safetensors").option("batch_size", "2").save(path)
    spark.conf.set("spark.sql.runSQLOnFiles", "false")
    try {
      val e = intercept[Exception](sql(s"SELECT * FROM safetensors.`$path`").collect())
      assert(messages(e).contains("TABLE_OR_VIEW_NOT_FOUND"), messages(e))
    } finally spark.conf.unset("spark.sql.runSQLOnFiles")
    sql("CREATE DATABASE safetensors")
    try withTable("safetensors.t") {
      sql("CREATE TABLE safetensors.t (a INT) USING parquet")
      sql("INSERT INTO safetensors.t VALUES (7)")
      assert(sql("SELECT a FROM safetensors.t").head().getInt(0) == 7)
      assert(sql(s"SELECT count(*) FROM safetensors.`$path`").head().getLong(0) == 3)
    } finally sql("DROP DATABASE safetensors")
  }

  test("CREATE TABLE ... LOCATION over a dataset: the inferred schema, SELECT, DESCRIBE, options") {
    val path = freshPath()
    rows(4).write.format("safetensors").option("batch_size", "3").save(path)
    withTable("ext", "ext_tensor") {
      sql(s"CREATE TABLE ext USING safetensors LOCATION '$path'")
      val described = sql("DESCRIBE TABLE ext").collect().map(r => r.getString(0) -> r.getString(1)).toMap
      assert(described("id") == "bigint" && described("x") == "array<float>", described)
      assert(spark.table("ext").schema.fieldNames.toSeq == Seq("id", "x"))
      assert(selected(sql("SELECT id, x FROM ext")) == expected(0 until 4))
      val extended = sql("DESCRIBE TABLE EXTENDED ext").collect().map(r => r.getString(0) -> r.getString(1)).toMap
      assert(extended("Provider") == "safetensors")
      assert(extended("Location").stripSuffix("/").endsWith(path), extended("Location"))
      // a read option stored with the table applies to its reads
      sql(s"CREATE TABLE ext_tensor USING safetensors OPTIONS (layout 'tensor') LOCATION '$path'")
      assert(spark.table("ext_tensor").schema.fieldNames.contains("key"))
      assert(sql("SELECT count(*) FROM ext_tensor").head().getLong(0) == 4) // 2 shards x (id, x)
    }
  }

  test("INSERT INTO / INSERT OVERWRITE an external table: the table's write options reach the writer") {
    val path = freshPath()
    rows(3).write.format("safetensors").option("batch_size", "2").save(path)
    withTable("ins") {
      sql(s"CREATE TABLE ins USING safetensors OPTIONS (batch_size '2', generate_index 'true') LOCATION '$path'")
      rows(6, from = 3).createOrReplaceTempView("more")
      assert(!new File(path, DatasetFiles.IndexDir).exists())
      sql("INSERT INTO ins SELECT id, x FROM more")
      assert(onDisk(path) == expected(0 until 9))
      assert(selected(spark.table("ins")) == expected(0 until 9))
      assert(manifest(path).get("total_samples").asInt == 9)
      assert(new File(path, DatasetFiles.IndexDir).listFiles().nonEmpty) // the table's generate_index
      // (a row in each of the two partitions: with generate_index, a write task of no rows is
      // a writer bug of its own, not of tables)
      sql("INSERT OVERWRITE ins SELECT id, x FROM more WHERE id IN (3, 7)")
      assert(onDisk(path) == expected(3 until 8).filter(r => r._1 == 3 || r._1 == 7))
      assert(selected(spark.table("ins")) == onDisk(path))
      // VALUES, with Spark's casts to the table's types
      sql("INSERT INTO ins VALUES (100, array(1.0, 2.5))")
      assert(onDisk(path).last == (100L -> Seq(1.0f, 2.5f)))
    }
  }

  test("the INSERT's own options override the table's; TBLPROPERTIES hold options too") {
    val path = freshPath()
    withTable("opt") {
      sql(s"CREATE TABLE opt (id BIGINT, x ARRAY<FLOAT>) USING safetensors " +
        s"TBLPROPERTIES ('batch_size' = '1', 'metadata' = '{\"team\": \"ml\"}') LOCATION '$path'")
      sql("INSERT INTO opt SELECT id, x FROM VALUES (1L, array(1f, 1.5f)), (2L, array(2f, 2.5f)) AS v(id, x)")
      val first = shardFiles(path)
      assert(first.map(f => readShard(f).tensor("id").shape.head) == Seq(1, 1))
      assert(first.forall(f => readShard(f).metadata("team") == "ml"))
      sql("INSERT INTO opt WITH ('metadata' = '{\"team\": \"vision\"}') SELECT id, x FROM VALUES " +
        "(3L, array(3f, 3.5f)), (4L, array(4f, 4.5f)) AS v(id, x)")
      val added = shardFiles(path).filterNot(first.contains)
      assert(added.size == 2 && added.forall(f => readShard(f).metadata("team") == "vision"))
      assert(onDisk(path) == expected(1 until 5))
      // the INSERT's batch_size is the one checked against the dataset's
      val other = intercept[Exception](sql("INSERT INTO opt WITH ('batch_size' = '5') VALUES (9L, array(9f, 9.5f))"))
      assert(messages(other).contains("batch_size is 5, the dataset has 1"), messages(other))
    }
  }

  test("TBLPROPERTIES retention: like the write option, an INSERT OVERWRITE keeps the old shards for versionAsOf, or with '0' deletes them") {
    for ((retention, seconds) <- Seq("2 hours" -> 7200L, "0" -> 0L)) {
      val path = freshPath()
      withTable("ret") {
        sql(s"CREATE TABLE ret (id BIGINT, x ARRAY<FLOAT>) USING safetensors " +
          s"TBLPROPERTIES ('batch_size' = '2', 'retention' = '$retention') LOCATION '$path'")
        rows(4).createOrReplaceTempView("ret_src")
        sql("INSERT INTO ret SELECT id, x FROM ret_src")
        val first = listedShards(path)
        sql("INSERT OVERWRITE ret SELECT id, x FROM ret_src WHERE id IN (1, 2)")
        assert(manifest(path).get("retention_seconds").asLong == seconds)
        assert(selected(spark.table("ret")) == expected(1 until 3))
        if (seconds > 0) {
          assert(first.forall(_.exists()), s"retention $retention: the overwritten shards stay")
          assert(selected(spark.read.format("safetensors").option("versionAsOf", 1).load(path)) == expected(0 until 4))
        } else {
          assert(first.forall(!_.exists()), s"retention $retention: the overwritten shards go")
          assert(shardFiles(path) == listedShards(path).sortBy(_.getName))
        }
      }
    }
  }

  test("a managed table: CREATE with a schema, empty until written, data in the warehouse; DROP removes it") {
    withTable("managed") {
      sql("CREATE TABLE managed (id BIGINT, x ARRAY<FLOAT>) USING safetensors OPTIONS (batch_size '2')")
      assert(sql("SELECT * FROM managed").count() == 0)
      assert(spark.table("managed").schema.fieldNames.toSeq == Seq("id", "x"))
      rows(3).createOrReplaceTempView("three")
      sql("INSERT INTO managed SELECT * FROM three")
      val dir = new File(warehouse, "managed").getAbsolutePath
      assert(onDisk(dir) == expected(0 until 3))
      assert(selected(spark.table("managed")) == expected(0 until 3))
      sql("DROP TABLE managed")
      assert(!new File(dir).exists())
    }
  }

  test("saveAsTable: every SaveMode; a managed table in the warehouse, an external one with path") {
    withTable("sat", "sat_ext") {
      rows(3).write.format("safetensors").option("batch_size", "2").saveAsTable("sat")
      val dir = new File(warehouse, "sat").getAbsolutePath
      assert(onDisk(dir) == expected(0 until 3))
      assert(selected(spark.table("sat")) == expected(0 until 3))
      val exists = intercept[Exception](
        rows(1).write.format("safetensors").option("batch_size", "2").saveAsTable("sat"))
      assert(messages(exists).contains("TABLE_OR_VIEW_ALREADY_EXISTS"), messages(exists))
      rows(1, from = 50).write.format("safetensors").mode("ignore").option("batch_size", "2").saveAsTable("sat")
      assert(onDisk(dir) == expected(0 until 3))
      rows(2, from = 3).write.format("safetensors").mode("append").option("batch_size", "2").saveAsTable("sat")
      assert(onDisk(dir) == expected(0 until 5))
      rows(2, from = 7).write.format("safetensors").mode("overwrite").option("batch_size", "2").saveAsTable("sat")
      assert(onDisk(new File(warehouse, "sat").getAbsolutePath) == expected(7 until 9))
      assert(selected(spark.table("sat")) == expected(7 until 9))
      val path = freshPath()
      rows(2).write.format("safetensors").option("batch_size", "2").option("path", path).saveAsTable("sat_ext")
      assert(onDisk(path) == expected(0 until 2))
      // overwrite replaces the external table: its old files are overwritten, not appended to
      rows(1, from = 30).write.format("safetensors").mode("overwrite").option("batch_size", "2")
        .option("path", path).saveAsTable("sat_ext")
      assert(onDisk(path) == expected(30 until 31))
      assert(selected(spark.table("sat_ext")) == expected(30 until 31))
      sql("DROP TABLE sat_ext")
      assert(onDisk(path) == expected(30 until 31)) // an external table's data stays
    }
  }

  test("KV tables (name_col) read back as the rows written: saveAsTable, CREATE TABLE + INSERT, WHERE, separators, dtypes") {
    withTable("kv_sat", "kv_ct") {
      val schema = StructType(Seq(StructField("key", StringType), StructField("v", ArrayType(FloatType)),
        StructField("m", ArrayType(ArrayType(DoubleType))), StructField("n", LongType)))
      val data = Seq(Row("a", Seq(1f, 2f), Seq(Seq(1.0, 2.0), Seq(3.0, 4.0)), 7L),
        Row("b__x", Seq(3f, 4f), Seq(Seq(5.5, 6.0), Seq(7.0, 8.0)), -1L))
      val df = spark.createDataFrame(spark.sparkContext.parallelize(data, 2), schema)
      // m written as F32: read back widened exactly, as a double column
      df.write.format("safetensors").option("name_col", "key").option("dtypes", """{"m":"F32"}""")
        .saveAsTable("kv_sat")
      val all = spark.table("kv_sat")
      assert(all.schema.map(_.dataType) == schema.map(_.dataType))
      assert(all.collect().map(r => r.getString(0) -> r).toMap.map { case (k, r) => k -> r.toSeq.drop(1) } ==
        data.map(r => r.getString(0) -> r.toSeq.drop(1)).toMap)
      assert(sql("SELECT n FROM kv_sat WHERE key = 'b__x'").collect().map(_.getLong(0)).toSeq == Seq(-1L))
      // a table with its own separator, written by INSERTs; a key that holds the separator
      sql("CREATE TABLE kv_ct (id STRING, emb ARRAY<FLOAT>, label INT) USING safetensors " +
        "OPTIONS (name_col 'id', kv_separator '::')")
      assert(spark.table("kv_ct").count() == 0)
      sql("INSERT INTO kv_ct VALUES ('u::1', array(0.5, 1.5), 3), ('u2', array(2.0, 2.5), 4)")
      sql("INSERT INTO kv_ct VALUES ('u3', array(9.0, 9.5), 5)")
      val got = sql("SELECT id, emb, label FROM kv_ct").collect()
        .map(r => (r.getString(0), r.getSeq[Float](1), r.getInt(2))).sortBy(_._1).toSeq
      assert(got == Seq(("u2", Seq(2f, 2.5f), 4), ("u3", Seq(9f, 9.5f), 5), ("u::1", Seq(0.5f, 1.5f), 3)))
      assert(sql("SELECT count(*) FROM kv_ct WHERE label > 3").collect().head.getLong(0) == 2)
      // by path it stays the per-tensor layout
      val location = spark.sessionState.catalog.getTableMetadata(TableIdentifier("kv_ct")).location.getPath
      assert(spark.read.format("safetensors").load(location).columns.contains("dtype"))
      // negative: a column whose type does not fit the tensors names the column, the tensor, dtype and shape
      withTable("kv_bad", "kv_nokey") {
        sql(s"CREATE TABLE kv_bad (id STRING, emb ARRAY<ARRAY<FLOAT>>, label INT) USING safetensors " +
          s"OPTIONS (name_col 'id') LOCATION '$location'")
        val bad = intercept[Exception](sql("SELECT * FROM kv_bad").collect())
        // which row's tensor is met first depends on which task runs first: any of the three names it
        val rankError = ("KV table column 'emb' \\(array<array<float>>\\): tensor '(u2|u3|u::1)::emb' " +
          "\\(F32, shape \\[2\\]\\): the column has rank 2").r
        assert(rankError.findFirstIn(messages(bad)).isDefined, messages(bad))
        // without name_col, the key is the one string column that is no tensor column: two are ambiguous
        sql(s"CREATE TABLE kv_nokey (id STRING, other STRING, emb ARRAY<FLOAT>, label INT) USING safetensors " +
          s"LOCATION '$location'")
        val ambiguous = intercept[Exception](sql("SELECT * FROM kv_nokey").collect())
        assert(messages(ambiguous).contains("the key column is the table's one string column that is not one of the " +
          "dataset's columns ('emb', 'label'), but the table has 'id', 'other'"),
          messages(ambiguous))
      }
    }
  }

  test("df.writeTo(t).using(\"safetensors\"): create, append, replace, createOrReplace") {
    withTable("wt") {
      rows(2).writeTo("wt").using("safetensors").option("batch_size", "2").create()
      val dir = new File(warehouse, "wt").getAbsolutePath
      assert(onDisk(dir) == expected(0 until 2))
      rows(2, from = 2).writeTo("wt").option("batch_size", "2").append()
      assert(selected(spark.table("wt")) == expected(0 until 4))
      rows(1, from = 9).writeTo("wt").using("safetensors").option("batch_size", "2").replace()
      assert(onDisk(dir) == expected(9 until 10))
      assert(selected(spark.table("wt")) == expected(9 until 10))
      rows(2, from = 20).writeTo("wt").using("safetensors").option("batch_size", "2").createOrReplace()
      assert(selected(spark.table("wt")) == expected(20 until 22))
      val again = intercept[Exception](rows(1).writeTo("wt").using("safetensors").option("batch_size", "2").create())
      assert(messages(again).contains("TABLE_OR_VIEW_ALREADY_EXISTS"), messages(again))
    }
  }

  test("save(path) keeps every SaveMode (the V1 route), with or without a catalog table on the path") {
    val path = freshPath()
    rows(2).write.format("safetensors").option("batch_size", "2").save(path)
    val e = intercept[IllegalArgumentException](
      rows(2).write.format("safetensors").option("batch_size", "2").save(path))
    assert(e.getMessage.contains("already exists (SaveMode ErrorIfExists"), e.getMessage)
    rows(1, from = 40).write.format("safetensors").mode(SaveMode.Ignore).option("batch_size", "2").save(path)
    assert(onDisk(path) == expected(0 until 2))
    rows(1, from = 2).write.format("safetensors").mode(SaveMode.Append).option("batch_size", "2").save(path)
    assert(onDisk(path) == expected(0 until 3))
    withTable("onpath") {
      sql(s"CREATE TABLE onpath USING safetensors LOCATION '$path'")
      rows(2, from = 5).write.format("safetensors").mode(SaveMode.Overwrite).option("batch_size", "2").save(path)
      assert(onDisk(path) == expected(5 until 7))
      sql("REFRESH TABLE onpath")
      assert(selected(spark.table("onpath")) == expected(5 until 7))
    }
    // a reserved table property is no option of a path write
    val reserved = intercept[Exception](rows(1).write.format("safetensors").mode("overwrite")
      .option("batch_size", "2").option("location", "/x").save(path))
    assert(messages(reserved).contains("unknown option 'location'"), messages(reserved))
  }

  test("negative: an unknown table option, a bad option value, no write options, no schema and no location") {
    val path = freshPath()
    rows(2).write.format("safetensors").option("batch_size", "2").save(path)
    val unknown = intercept[Exception](
      sql(s"CREATE TABLE bad USING safetensors OPTIONS (batch_sise '2') LOCATION '$path'"))
    assert(messages(unknown).contains("unknown table option(s) 'batch_sise'"), messages(unknown))
    assert(messages(unknown).contains("batch_size"), messages(unknown))
    assert(!spark.catalog.tableExists("bad"))
    val unknownProp = intercept[Exception](
      sql(s"CREATE TABLE bad USING safetensors TBLPROPERTIES ('colour' = 'red') LOCATION '$path'"))
    assert(messages(unknownProp).contains("unknown table option(s) 'colour'"), messages(unknownProp))
    withTable("badvalue", "nowrite") {
      // a bad read option fails the schema inference of CREATE (and a read of a declared schema)
      val layout = intercept[Exception](
        sql(s"CREATE TABLE badvalue USING safetensors OPTIONS (layout 'wide') LOCATION '$path'"))
      assert(messages(layout).contains("option 'layout' must be one of"), messages(layout))
      sql(s"CREATE TABLE badvalue (id BIGINT) USING safetensors OPTIONS (layout 'wide') LOCATION '$path'")
      val layoutRead = intercept[Exception](sql("SELECT * FROM badvalue").collect())
      assert(messages(layoutRead).contains("option 'layout' must be one of"), messages(layoutRead))
      sql(s"CREATE TABLE nowrite USING safetensors OPTIONS (batch_size '2', tail_strategy 'sideways') " +
        s"LOCATION '$path'")
      val bad = intercept[Exception](sql("INSERT INTO nowrite SELECT id, x FROM safetensors.`" + path + "`"))
      assert(messages(bad).contains("tail_strategy"), messages(bad))
      assert(onDisk(path) == expected(0 until 2)) // nothing written
    }
    val noSchema = intercept[Exception](sql("CREATE TABLE noschema USING safetensors"))
    assert(messages(noSchema).contains("needs a schema, or a LOCATION"), messages(noSchema))
    withTable("nomode") {
      sql("CREATE TABLE nomode (id BIGINT, x ARRAY<FLOAT>) USING safetensors")
      val noMode = intercept[Exception](sql("INSERT INTO nomode VALUES (1, array(1.0))"))
      assert(messages(noMode).contains("batch_size"), messages(noMode))
    }
  }

  test("negative: INSERT with a mismatching schema; partition transforms other than identity") {
    val path = freshPath()
    rows(2).write.format("safetensors").option("batch_size", "2").save(path)
    withTable("typed", "bucketed", "parts") {
      sql(s"CREATE TABLE typed USING safetensors OPTIONS (batch_size '2') LOCATION '$path'")
      val columns = intercept[Exception](sql("INSERT INTO typed SELECT 1L AS id"))
      assert(messages(columns).contains("INSERT_COLUMN_ARITY_MISMATCH"), messages(columns))
      val types = intercept[Exception](sql("INSERT INTO typed SELECT 1L, map('a', 1)"))
      assert(messages(types).contains("`x`"), messages(types))
      assert(onDisk(path) == expected(0 until 2))
      val bucket = intercept[Exception](sql(
        "CREATE TABLE bucketed (id BIGINT, x ARRAY<FLOAT>) USING safetensors PARTITIONED BY (bucket(4, id))"))
      assert(messages(bucket).contains("partition transforms are not supported"), messages(bucket))
      val order = intercept[Exception](sql(
        "CREATE TABLE parts (id BIGINT, x ARRAY<FLOAT>) USING safetensors PARTITIONED BY (id)"))
      assert(messages(order).contains("must be its last columns"), messages(order))
    }
  }

  test("a partitioned table: INSERT writes a dataset per directory; a table over a partitioned root") {
    withTable("pt", "pt_root") {
      sql("CREATE TABLE pt (x ARRAY<FLOAT>, split STRING) USING safetensors " +
        "OPTIONS (batch_size '2') PARTITIONED BY (split)")
      sql("INSERT INTO pt VALUES (array(1.0, 1.5), 'train'), (array(2.0, 2.5), 'test'), (array(3.0, 3.5), 'train')")
      val dir = new File(warehouse, "pt")
      assert(new File(dir, "split=train/dataset_manifest.json").isFile)
      assert(manifest(new File(dir, "split=test").getAbsolutePath).get("total_samples").asInt == 1)
      assert(sql("SELECT split, count(*) FROM pt GROUP BY split ORDER BY split").collect().toSeq ==
        Seq(Row("test", 1L), Row("train", 2L)))
      sql(s"CREATE TABLE pt_root USING safetensors LOCATION '${dir.getAbsolutePath}'")
      val extended = sql("DESCRIBE TABLE EXTENDED pt_root").collect().map(_.getString(0))
      assert(extended.contains("# Partition Information"), extended.mkString(", "))
      assert(sql("SELECT count(*) FROM pt_root WHERE split = 'train'").head().getLong(0) == 2)
    }
  }
}
