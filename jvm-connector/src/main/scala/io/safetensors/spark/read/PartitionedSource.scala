package io.safetensors.spark.read

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.sources.Filter
import org.apache.spark.sql.types.StructType
import io.safetensors.spark.files.HivePartitions

/**
 * A root whose data sits in Hive-style partition directories (`split=train/…`, each a dataset of
 * its own, as a `partitionBy` write makes them): the table's schema is a directory's data schema
 * followed by the partition columns; a scan lists and plans only the directories its partition
 * filters can match, each through a [[ReadSource]] of its own, and its rows carry the directory's
 * values (spec/reading.md §6).
 */
private[spark] final class PartitionedSource(val options: ReadOptions, val conf: Configuration,
    root: Path, dirs: Seq[HivePartitions.Dir], override val partitionSchema: StructType)
    extends TableSource {
  private val sources = mutable.Map[Path, ReadSource]()

  /**
   * The first directory with columns decides the schema and the layout (for `layout=auto`); the
   * others must agree. A dataset of no samples (e.g. one a static overwrite emptied) has none.
   */
  private lazy val (firstDir: HivePartitions.Dir, first: ReadSource) = {
    val dir = dirs.find(d => source(d, options.layout).description.schema.nonEmpty).getOrElse(dirs.head)
    val src = source(dir, options.layout)
    // the others are planned with its layout
    synchronized {
      sources.clear()
      sources(dir.path) = src
    }
    (dir, src)
  }

  private def source(d: HivePartitions.Dir, layout: String): ReadSource = synchronized {
    sources.getOrElseUpdate(d.path,
      new ReadSource(options.copy(paths = Seq(d.path.toString), layout = layout), conf))
  }

  override lazy val description: Description = {
    val d = first.description
    val taken = (d.schema.fieldNames ++ d.metadataColumns.fieldNames).map(_.toLowerCase).toSet
    partitionSchema.fieldNames.find(n => taken(n.toLowerCase)).foreach { n =>
      throw new IllegalArgumentException(
        s"safetensors: partition column '$n' of the directories under $root is also a column of " +
          s"the data in ${firstDir.path} (layout ${d.layout}); rename one of them")
    }
    d.copy(schema = StructType(d.schema.fields ++ partitionSchema.fields))
  }

  override def summary: String = s"partitionDirs=${dirs.size}"

  /**
   * The partition directories whose rows all satisfy every one of `filters`, when the partition
   * values alone decide each filter for every directory; None when a filter needs the rows, or
   * when a directory has a null partition value (SQL's NULL is not decided here: the caller reads
   * the rows).
   */
  def wholeDirsWhere(filters: Seq[Filter]): Option[Seq[Path]] =
    if (filters.isEmpty || dirs.exists(_.values.exists(_._2.isEmpty))) None
    else {
      val decided = dirs.map(d => d -> filters.map(HivePartitions.decide(_, d, partitionSchema)))
      if (decided.exists(_._2.exists(_.isEmpty))) None
      else Some(decided.collect { case (d, r) if r.forall(_.contains(true)) => d.path })
    }

  override def plan(required: StructType, predicates: Seq[ReadPredicate],
      partitionFilters: Seq[Filter], maxPartitionBytes: Long, openCostBytes: Long,
      minPartitions: Int): Seq[SafetensorsInputPartition] = {
    val layout = description.layout
    val dataSchema = first.description.schema
    val partitionNames = partitionSchema.fieldNames.toSet
    val dataRequired = StructType(required.fields.filterNot(f => partitionNames(f.name)))
    dirs.filter(d => partitionFilters.forall(HivePartitions.mayMatch(_, d, partitionSchema)))
      .flatMap { d =>
        val src = source(d, layout)
        val schema = src.description.schema
        if (schema.isEmpty) Seq.empty // no samples
        else if (!SafetensorsTable.sameType(schema, dataSchema)) {
          throw new IllegalArgumentException(
            s"safetensors: partition directory ${d.path} has the columns ${schema.simpleString} " +
              s"but ${firstDir.path} has ${dataSchema.simpleString} (layout $layout); every " +
              "directory under a partitioned root must hold the same columns")
        } else {
          val values = HivePartitions.row(d, partitionSchema)
          src.planSpecs(dataRequired, predicates, maxPartitionBytes, openCostBytes, minPartitions)
            .map { case (json, bytes) => SafetensorsInputPartition(json, bytes, values) }
        }
      }
  }
}

private[spark] object PartitionedSource {
  /**
   * A [[PartitionedSource]] when `options` name one directory (no glob) whose data sits in
   * partition directories and recursive lookup is on; None otherwise.
   */
  def discover(options: ReadOptions, conf: Configuration, inferTypes: Boolean): Option[PartitionedSource] =
    options.paths match {
      case Seq(raw) if options.recursive && !raw.exists(c => "*?[{".contains(c)) =>
        val path = new Path(raw)
        val fs = path.getFileSystem(conf)
        val root = fs.makeQualified(path)
        if (!fs.exists(root) || !fs.getFileStatus(root).isDirectory) None
        else HivePartitions.discover(fs, root).map { dirs =>
          // each partition directory is a dataset with versions of its own: no one version
          // number or time names a state of the root (spec/dataset.md §5.8)
          if (options.versionAsOf.isDefined || options.timestampAsOf.isDefined) {
            throw new IllegalArgumentException(s"safetensors: $root is a partitioned root; each " +
              "partition directory has versions of its own, so options 'versionAsOf' and " +
              "'timestampAsOf' read one partition directory (a dataset), not the root")
          }
          new PartitionedSource(options, conf, root, dirs, HivePartitions.schema(dirs, inferTypes))
        }
      case _ => None
    }
}
