//! Errors of the bridge and the Java exception each one becomes (spec/jni.md §1).
//!
//! The engine's error variant chooses the class, here and only here, so the JVM catches by type
//! and never matches message text:
//!
//! | [`JniError`] | Java class (`io.safetensors.spark.jni.` unless named) | what it means |
//! |---|---|---|
//! | `InvalidArgument` | `java.lang.IllegalArgumentException` | the JVM side called wrongly (null or 0 handle, bad address, unknown mode) |
//! | `Options` | `SafetensorsOptionsException` (extends `IllegalArgumentException`) | an option, a schema or an append that cannot be honoured |
//! | `Format` | `SafetensorsFormatException` (extends `SafetensorsException`) | a file breaks spec/format.md or does not hold what the scan planned |
//! | `Dataset` | `SafetensorsDatasetException` (extends `SafetensorsException`) | a manifest, a manifest log entry or an index part breaks spec/dataset.md, or a listed shard is missing |
//! | `Data` | `SafetensorsDataException` (extends `SafetensorsException`) | a row the write cannot store (a value, a shape, a duplicate key or name) |
//! | `Failed` | `SafetensorsException` | I/O, JNI and internal errors, Rust panics |

use ::jni::errors::Error as JniCrateError;
use ::jni::jni_str;
use ::jni::strings::JNIStr;
use std::any::Any;

use safetensors_spark_dataset::index::IndexError;
use safetensors_spark_dataset::DatasetError;
use safetensors_spark_engine::read::{ReadError, ReadErrorKind};
use safetensors_spark_engine::write::commit::CommitError;
use safetensors_spark_engine::write::plan::PlanError;
use safetensors_spark_engine::write::task::WriteError;
use safetensors_spark_format::{ConvertError, FormatError};

/// Message prefix of the exception that reports a Rust panic.
pub const PANIC_MESSAGE_PREFIX: &str = "internal error (Rust panic): ";

/// Error of a bridge call; the variant chooses the Java exception class ([`exception_for`]), the
/// `Display` text becomes its message.
#[derive(Debug, thiserror::Error)]
pub enum JniError {
    /// The JVM side called wrongly (null/0 handle, bad address, bad mode...).
    #[error("{0}")]
    InvalidArgument(String),
    /// An option, a schema or an append the user asked for that cannot be honoured.
    #[error("{0}")]
    Options(String),
    /// A file breaks the format, or does not hold what the scan planned.
    #[error("{0}")]
    Format(String),
    /// A manifest, manifest log entry or index part breaks the dataset layout, or a listed shard
    /// is missing.
    #[error("{0}")]
    Dataset(String),
    /// A row the write cannot store.
    #[error("{0}")]
    Data(String),
    /// Anything else: I/O, JNI, internal.
    #[error("{0}")]
    Failed(String),
}

impl JniError {
    /// Shorthand for [`JniError::InvalidArgument`].
    pub fn invalid_argument(msg: impl Into<String>) -> Self {
        JniError::InvalidArgument(msg.into())
    }

    /// Shorthand for [`JniError::Failed`].
    pub fn failed(msg: impl Into<String>) -> Self {
        JniError::Failed(msg.into())
    }

    /// The same kind of error with `context` before its message (`context: message`).
    pub fn context(self, context: impl std::fmt::Display) -> Self {
        let msg = format!("{context}: {self}");
        self.with_message(msg)
    }

    /// The same kind of error with another message.
    fn with_message(self, msg: String) -> Self {
        match self {
            JniError::InvalidArgument(_) => JniError::InvalidArgument(msg),
            JniError::Options(_) => JniError::Options(msg),
            JniError::Format(_) => JniError::Format(msg),
            JniError::Dataset(_) => JniError::Dataset(msg),
            JniError::Data(_) => JniError::Data(msg),
            JniError::Failed(_) => JniError::Failed(msg),
        }
    }
}

/// Required by `EnvUnowned::with_env`; lets closures use `?` on `jni` calls.
/// A pending Java exception (`Error::JavaException`) is never replaced: the policy checks
/// `exception_check()` before throwing.
impl From<JniCrateError> for JniError {
    fn from(err: JniCrateError) -> Self {
        JniError::Failed(format!("JNI error: {err}"))
    }
}

impl From<FormatError> for JniError {
    fn from(err: FormatError) -> Self {
        match err {
            FormatError::Io { .. } => JniError::Failed(err.to_string()),
            _ => JniError::Format(err.to_string()),
        }
    }
}

impl From<std::io::Error> for JniError {
    fn from(err: std::io::Error) -> Self {
        JniError::Failed(format!("I/O error: {err}"))
    }
}

/// A value the SQL tensor functions cannot convert: an argument of the call.
impl From<ConvertError> for JniError {
    fn from(err: ConvertError) -> Self {
        JniError::InvalidArgument(err.to_string())
    }
}

impl From<ReadError> for JniError {
    fn from(err: ReadError) -> Self {
        let msg = err.to_string();
        match &err.kind {
            ReadErrorKind::Format(FormatError::Io { .. }) => JniError::Failed(msg),
            ReadErrorKind::Format(_)
            | ReadErrorKind::ByteLength { .. }
            | ReadErrorKind::DataLength { .. }
            | ReadErrorKind::U64Overflow { .. }
            | ReadErrorKind::RowRange { .. }
            | ReadErrorKind::RowCount { .. }
            | ReadErrorKind::MissingTensor
            | ReadErrorKind::RaggedOffsets(_)
            | ReadErrorKind::NotUtf8 { .. }
            | ReadErrorKind::ReservedMetadata { .. }
            | ReadErrorKind::Corrupt(_)
            | ReadErrorKind::Checksum(_)
            | ReadErrorKind::Changed(_) => JniError::Format(msg),
            ReadErrorKind::Manifest(_)
            | ReadErrorKind::MissingShard { .. }
            | ReadErrorKind::Index(_) => JniError::Dataset(msg),
            // What was asked of the files rather than what is in them; still thrown as a
            // SafetensorsException, which a scan with ignoreCorruptFiles skips.
            ReadErrorKind::NotDecodable { .. }
            | ReadErrorKind::NoRowDimension
            | ReadErrorKind::TooLarge { .. }
            | ReadErrorKind::TooManyColumns { .. }
            | ReadErrorKind::NotWidenable { .. }
            | ReadErrorKind::ColumnConflict(_)
            | ReadErrorKind::UnknownColumn { .. }
            | ReadErrorKind::Invalid(_)
            | ReadErrorKind::NotSupplied { .. }
            | ReadErrorKind::Arrow(_) => JniError::Failed(msg),
        }
    }
}

impl From<WriteError> for JniError {
    fn from(err: WriteError) -> Self {
        let msg = err.to_string();
        match err {
            WriteError::Row { .. }
            | WriteError::Convert { .. }
            | WriteError::DuplicateKey { .. }
            | WriteError::TensorName { .. } => JniError::Data(msg),
            WriteError::Seal { source, .. } | WriteError::Format(source) => {
                JniError::from(source).with_message(msg)
            }
            WriteError::Malformed { .. }
            | WriteError::Batch(_)
            | WriteError::Failed
            | WriteError::Io { .. } => JniError::Failed(msg),
        }
    }
}

impl From<CommitError> for JniError {
    fn from(err: CommitError) -> Self {
        let msg = err.to_string();
        match err {
            CommitError::ColumnMismatch { .. }
            | CommitError::DuplicateKey { .. }
            | CommitError::TensorNameCollision { .. }
            | CommitError::KeyInDataset { .. } => JniError::Data(msg),
            CommitError::Dataset(e) => JniError::from(e).with_message(msg),
            CommitError::Format(e) => JniError::from(e).with_message(msg),
            CommitError::Rewrite { .. } | CommitError::BadReport { .. } => JniError::Failed(msg),
        }
    }
}

/// An append that conflicts with the dataset is an options error; anything else about a
/// manifest is a dataset error.
impl From<DatasetError> for JniError {
    fn from(err: DatasetError) -> Self {
        match err {
            DatasetError::AppendMismatch { .. } | DatasetError::Vacuum { .. } => {
                JniError::Options(err.to_string())
            }
            _ => JniError::Dataset(err.to_string()),
        }
    }
}

impl From<IndexError> for JniError {
    fn from(err: IndexError) -> Self {
        match err {
            IndexError::Io { .. } => JniError::Failed(err.to_string()),
            _ => JniError::Dataset(err.to_string()),
        }
    }
}

/// Every plan error is about the options or the schema the user gave.
impl From<PlanError> for JniError {
    fn from(err: PlanError) -> Self {
        JniError::Options(err.to_string())
    }
}

/// The Java exception class a [`JniError`] maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JavaException {
    /// `java.lang.IllegalArgumentException`
    IllegalArgument,
    /// `io.safetensors.spark.jni.SafetensorsOptionsException`
    Options,
    /// `io.safetensors.spark.jni.SafetensorsFormatException`
    Format,
    /// `io.safetensors.spark.jni.SafetensorsDatasetException`
    Dataset,
    /// `io.safetensors.spark.jni.SafetensorsDataException`
    Data,
    /// `io.safetensors.spark.jni.SafetensorsException`
    Safetensors,
}

impl JavaException {
    /// Every class, for tests.
    pub const ALL: [JavaException; 6] = [
        JavaException::IllegalArgument,
        JavaException::Options,
        JavaException::Format,
        JavaException::Dataset,
        JavaException::Data,
        JavaException::Safetensors,
    ];

    /// Internal (slash) class name, for tests and messages.
    pub fn class_name(self) -> &'static str {
        match self {
            JavaException::IllegalArgument => "java/lang/IllegalArgumentException",
            JavaException::Options => "io/safetensors/spark/jni/SafetensorsOptionsException",
            JavaException::Format => "io/safetensors/spark/jni/SafetensorsFormatException",
            JavaException::Dataset => "io/safetensors/spark/jni/SafetensorsDatasetException",
            JavaException::Data => "io/safetensors/spark/jni/SafetensorsDataException",
            JavaException::Safetensors => "io/safetensors/spark/jni/SafetensorsException",
        }
    }

    /// [`JavaException::class_name`] as the JNI string `FindClass` takes (a unit test checks
    /// that the two agree).
    pub(crate) fn jni_class_name(self) -> &'static JNIStr {
        match self {
            JavaException::IllegalArgument => jni_str!("java/lang/IllegalArgumentException"),
            JavaException::Options => {
                jni_str!("io/safetensors/spark/jni/SafetensorsOptionsException")
            }
            JavaException::Format => {
                jni_str!("io/safetensors/spark/jni/SafetensorsFormatException")
            }
            JavaException::Dataset => {
                jni_str!("io/safetensors/spark/jni/SafetensorsDatasetException")
            }
            JavaException::Data => jni_str!("io/safetensors/spark/jni/SafetensorsDataException"),
            JavaException::Safetensors => {
                jni_str!("io/safetensors/spark/jni/SafetensorsException")
            }
        }
    }
}

/// Exception class and message for an error (pure; unit-tested without a JVM).
pub fn exception_for(err: &JniError) -> (JavaException, String) {
    let class = match err {
        JniError::InvalidArgument(_) => JavaException::IllegalArgument,
        JniError::Options(_) => JavaException::Options,
        JniError::Format(_) => JavaException::Format,
        JniError::Dataset(_) => JavaException::Dataset,
        JniError::Data(_) => JavaException::Data,
        JniError::Failed(_) => JavaException::Safetensors,
    };
    (class, err.to_string())
}

/// Exception message for a panic payload (`&str` and `String` payloads keep their text).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    let text = if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    };
    format!("{PANIC_MESSAGE_PREFIX}{text}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use safetensors_spark_format::Dtype;

    fn class_of(err: impl Into<JniError>) -> JavaException {
        exception_for(&err.into()).0
    }

    #[test]
    fn each_variant_has_its_class_and_keeps_the_display_message() {
        let (class, msg) = exception_for(&JniError::invalid_argument("bad mode"));
        assert_eq!(class, JavaException::IllegalArgument);
        assert_eq!(class.class_name(), "java/lang/IllegalArgumentException");
        assert_eq!(msg, "bad mode");
        let cases = [
            (JniError::Options("o".into()), JavaException::Options),
            (JniError::Format("f".into()), JavaException::Format),
            (JniError::Dataset("d".into()), JavaException::Dataset),
            (JniError::Data("r".into()), JavaException::Data),
            (JniError::failed("x"), JavaException::Safetensors),
        ];
        for (err, want) in cases {
            let text = err.to_string();
            let (class, msg) = exception_for(&err);
            assert_eq!((class, msg), (want, text));
        }
    }

    #[test]
    fn engine_errors_choose_the_class_by_variant() {
        let format = FormatError::HeaderTooSmall { file_len: 3 };
        let err: JniError = format.into();
        assert_eq!(
            exception_for(&err),
            (
                JavaException::Format,
                FormatError::HeaderTooSmall { file_len: 3 }.to_string()
            )
        );
        assert_eq!(
            class_of(FormatError::io("/x", std::io::Error::other("disk gone"))),
            JavaException::Safetensors
        );
        assert_eq!(
            class_of(std::io::Error::other("disk gone")),
            JavaException::Safetensors
        );
        assert_eq!(
            class_of(JniCrateError::JavaException),
            JavaException::Safetensors
        );

        let read = |kind| ReadError::new("f.safetensors", None, kind);
        assert_eq!(
            class_of(read(ReadErrorKind::DataLength {
                expected: 8,
                actual: 4
            })),
            JavaException::Format
        );
        assert_eq!(
            class_of(read(ReadErrorKind::Manifest("bad".into()))),
            JavaException::Dataset
        );
        assert_eq!(
            class_of(read(ReadErrorKind::NotDecodable {
                dtype: Dtype::F8E4M3
            })),
            JavaException::Safetensors
        );

        let mismatch = DatasetError::AppendMismatch {
            problem: "dtype".into(),
        };
        assert_eq!(class_of(mismatch), JavaException::Options);
        let invalid = DatasetError::InvalidManifest {
            problem: "no shards".into(),
        };
        assert_eq!(class_of(invalid), JavaException::Dataset);

        let row = WriteError::Batch("short".into());
        assert_eq!(class_of(row), JavaException::Safetensors);
        let seal = WriteError::Seal {
            file: "s".into(),
            source: FormatError::HeaderTooSmall { file_len: 3 },
        };
        let (class, msg) = exception_for(&seal.into());
        assert_eq!(class, JavaException::Format);
        assert!(msg.starts_with("shard 's' could not be sealed: "), "{msg}");
    }

    #[test]
    fn context_keeps_the_class() {
        let err = JniError::from(DatasetError::InvalidManifest {
            problem: "p".into(),
        })
        .context("the dataset's current dataset_manifest.json");
        let (class, msg) = exception_for(&err);
        assert_eq!(class, JavaException::Dataset);
        assert_eq!(
            msg,
            "the dataset's current dataset_manifest.json: invalid dataset manifest: p"
        );
    }

    #[test]
    fn jni_class_names_match_the_string_constants() {
        for class in JavaException::ALL {
            assert_eq!(class.jni_class_name().to_str(), class.class_name());
        }
    }
}
