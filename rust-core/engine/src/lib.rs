//! The Spark engine of safetensors-spark, on top of the format ([`safetensors_spark_format`]) and
//! the dataset crate ([`safetensors_spark_dataset`]); JNI-free: the bridge crate
//! (`rust-core/jni`) exposes it to the JVM connector.
//!
//! * [`read`] — the Spark read path: dtype decoding, the per-sample, per-tensor and per-file row
//!   layouts as Arrow record batches, scan planning (driver) and read tasks (executors).
//! * [`write`] — the Spark write path: plan, per-task shard writers, KV sealing, commit.
//! * [`tensor_functions`] — the value rules of the SQL functions `arr_to_st` / `st_to_array`.

pub mod read;
pub mod tensor_functions;
pub mod write;
