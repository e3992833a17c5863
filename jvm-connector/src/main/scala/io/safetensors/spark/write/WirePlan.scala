package io.safetensors.spark.write

import io.safetensors.spark.internal.Json
import com.fasterxml.jackson.databind.JsonNode

import scala.jdk.CollectionConverters._

/** What the JVM needs of the Rust `WritePlan` JSON to build wire batches (nothing else). */
private[spark] sealed trait WireInput
private[spark] object WireInput {
  final case class NumericArray(element: String, depth: Int) extends WireInput
  final case class Scalar(element: String) extends WireInput
  case object Binary extends WireInput
  case object TensorStruct extends WireInput
  case object MlVector extends WireInput
  /** A string column (batch mode, ragged): travels as Utf8. */
  case object Str extends WireInput
}

private[spark] final case class WireColumn(name: String, fieldIndex: Int, input: WireInput)

/** `kv`: a key column (Utf8, field `nameFieldIndex` of the DataFrame) precedes the columns. */
private[spark] final case class WirePlan(kv: Boolean, nameFieldIndex: Int,
    columns: IndexedSeq[WireColumn])

private[spark] object WirePlan {
  private val mapper = Json.mapper

  def parse(planJson: String): WirePlan = parse(mapper.readTree(planJson))

  def parse(plan: JsonNode): WirePlan = {
    val layout = plan.get("layout")
    val kv = layout.get("layout").asText() == "kv"
    val nameIdx = if (kv) layout.get("name_field_index").asInt() else -1
    val cols = plan.get("columns").elements().asScala.map { c =>
      val in = c.get("input")
      val input = in.get("kind").asText() match {
        case "numeric_array" => WireInput.NumericArray(in.get("element").asText(), in.get("depth").asInt())
        case "scalar" => WireInput.Scalar(in.get("element").asText())
        case "binary" => WireInput.Binary
        case "tensor_struct" => WireInput.TensorStruct
        case "ml_vector" => WireInput.MlVector
        case "string" => WireInput.Str
        case other => throw new IllegalStateException(s"unknown input kind in write plan: $other")
      }
      WireColumn(c.get("name").asText(), c.get("field_index").asInt(), input)
    }.toIndexedSeq
    WirePlan(kv, nameIdx, cols)
  }
}
