package io.safetensors.spark.catalog

import java.time.{Instant, LocalDateTime, ZoneOffset}
import java.time.temporal.ChronoUnit
import java.util.Locale

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.{SparkSession, SparkSessionExtensions}
import org.apache.spark.sql.catalyst.TableIdentifier
import org.apache.spark.sql.catalyst.analysis.{RelationTimeTravel, UnresolvedRelation}
import org.apache.spark.sql.catalyst.expressions.Expression
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.types.{TimestampNTZType, TimestampType}
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.safetensors.{SparkInternals, SparkLine}

/**
 * SQL on files: ``SELECT ... FROM safetensors.`/path/to/dataset` `` (spec/sql.md §1).
 *
 * Spark's own rule for this (`ResolveSQLOnFile`) takes only V1 `FileFormat` sources and refuses
 * every other one with UNSUPPORTED_DATASOURCE_FOR_DIRECT_QUERY; it runs in the analyzer's
 * Resolution batch, before any rule an extension can add there. So this rule is added to the
 * batch that runs before it (the "Hints" batch, `injectHintResolutionRule`): it turns the
 * two-part name `safetensors.<path>` into the relation `spark.read.format("safetensors")
 * .load(path)` gives, unless a table of that name exists or SQL on files is off
 * (`spark.sql.runSQLOnFiles`).
 */
object SqlOnFiles {
  val Prefix = "safetensors"

  /** Adds the rule where the Spark line allows it (4.x; not 3.5: SparkLine). */
  def inject(extensions: SparkSessionExtensions): Unit =
    SparkLine.injectPreResolutionRule(extensions, spark => new FileRule(spark))

  final class FileRule(spark: SparkSession) extends Rule[LogicalPlan] {
    override def apply(plan: LogicalPlan): LogicalPlan =
      if (!spark.conf.get("spark.sql.runSQLOnFiles", "true").toBoolean) plan
      else plan.resolveOperatorsDown {
        // `safetensors.`/path` VERSION AS OF n` / `TIMESTAMP AS OF '...'` (spec/sql.md §1): the
        // read options versionAsOf / timestampAsOf
        case RelationTimeTravel(u: UnresolvedRelation, timestamp, version) if isFile(u) =>
          val travel = version.map("versionAsOf" -> _).toMap ++
            timestamp.map(t => "timestampAsOf" -> timeText(t)).toMap
          load(u, travel)
        case u: UnresolvedRelation if isFile(u) => load(u, Map.empty)
      }

    private def timeText(t: Expression): String = {
      if (!t.foldable) {
        throw new IllegalArgumentException(
          s"safetensors: TIMESTAMP AS OF needs a constant time, got ${t.sql}")
      }
      (t.eval(), t.dataType) match {
        case (micros: java.lang.Long, TimestampType) =>
          Instant.EPOCH.plus(micros, ChronoUnit.MICROS).toString
        case (micros: java.lang.Long, TimestampNTZType) =>
          LocalDateTime.ofEpochSecond(Math.floorDiv(micros.longValue, 1000000L),
            (Math.floorMod(micros.longValue, 1000000L) * 1000).toInt, ZoneOffset.UTC).toString
        case (null, _) => throw new IllegalArgumentException("safetensors: TIMESTAMP AS OF NULL")
        case (v, _) => v.toString
      }
    }

    private def load(u: UnresolvedRelation, travel: Map[String, String]): LogicalPlan = {
      val path = u.multipartIdentifier.last
      if (path.isEmpty) {
        throw new IllegalArgumentException("safetensors: SQL on files needs a path: safetensors.`/path`")
      }
      // a write target's relation (DELETE FROM) carries Spark's own marker option (4.0:
      // UnresolvedRelation.REQUIRED_WRITE_PRIVILEGES), which is no read option
      val options = u.options.asCaseSensitiveMap().asScala.filterNot(_._1 == "__required_write_privileges__")
      SparkInternals.logicalPlan(spark.read.format(Prefix).options(options).options(travel).load(path))
    }

    private def isFile(u: UnresolvedRelation): Boolean = u.multipartIdentifier match {
      case Seq(head, name) if head.toLowerCase(Locale.ROOT) == Prefix =>
        !SparkInternals.tableExists(spark, TableIdentifier(name, Some(head)))
      case _ => false
    }
  }
}
