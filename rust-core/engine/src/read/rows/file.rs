//! The per-file layout: one row per file, its tensors as struct fields, and the forensic columns.

use super::*;

/// A field of the Tensor Struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TensorField {
    /// `data` (Binary): the raw bytes; the only field that reads data bytes.
    Data,
    /// `shape` (`List<Int64>`).
    Shape,
    /// `dtype` (Utf8).
    Dtype,
}

impl TensorField {
    /// Every field, in the Tensor Struct's order.
    pub const ALL: [TensorField; 3] = [TensorField::Data, TensorField::Shape, TensorField::Dtype];

    pub fn name(self) -> &'static str {
        match self {
            TensorField::Data => "data",
            TensorField::Shape => "shape",
            TensorField::Dtype => "dtype",
        }
    }

    /// Parses a field name (`data`, `shape`, `dtype`).
    pub fn from_name(name: &str) -> Option<TensorField> {
        TensorField::ALL.into_iter().find(|f| f.name() == name)
    }

    pub fn field(self) -> Field {
        match self {
            TensorField::Data => Field::new("data", DataType::Binary, false),
            TensorField::Shape => Field::new("shape", shape_type(), false),
            TensorField::Dtype => Field::new("dtype", DataType::Utf8, false),
        }
    }
}

/// The Tensor Struct type: `{data: Binary, shape: List<Int64>, dtype: Utf8}` (the type the
/// writer accepts back).
pub fn tensor_struct_type() -> DataType {
    DataType::Struct(tensor_struct_fields())
}

pub(super) fn tensor_struct_fields() -> Fields {
    tensor_struct_fields_of(&TensorField::ALL)
}

/// The Tensor Struct's fields pruned to `fields` (in that order).
pub fn tensor_struct_fields_of(fields: &[TensorField]) -> Fields {
    Fields::from(fields.iter().map(|f| f.field()).collect::<Vec<_>>())
}

/// Schema of [`file_rows`]: `file`, one nullable Tensor Struct column per key (named after
/// it), `metadata`.
pub fn file_rows_schema(keys: &[&str]) -> SchemaRef {
    let mut fields = vec![Field::new("file", DataType::Utf8, false)];
    fields.extend(
        keys.iter()
            .map(|k| Field::new(*k, tensor_struct_type(), true)),
    );
    fields.push(metadata_field());
    Arc::new(Schema::new(fields))
}

/// One column of the per-file layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileColumn<'a> {
    /// `file` (Utf8): the source's name.
    File,
    /// `metadata`: the file's `__metadata__`.
    Metadata,
    /// `flags`: the file's forensic flags, cut to these fields.
    Flags(&'a [String]),
    /// `model_info`: the file's model information, cut to these fields.
    ModelInfo(&'a [String]),
    /// `sha256`: of each whole file, lower-case hex, computed by the caller (one per file:
    /// the bytes are streamed, never held; see `read::task`).
    Sha256(&'a [String]),
    /// A Tensor Struct (nullable: null when the file has no tensor `key`) with `fields`.
    Tensor {
        key: &'a str,
        fields: &'a [TensorField],
    },
}

impl FileColumn<'_> {
    /// The column's Arrow field (a tensor column is named after its key).
    pub fn field(&self) -> Field {
        match self {
            FileColumn::File => Field::new("file", DataType::Utf8, false),
            FileColumn::Metadata => metadata_field(),
            FileColumn::Flags(fields) => Field::new("flags", flags_type(fields), false),
            FileColumn::ModelInfo(fields) => {
                Field::new("model_info", model_info_type(fields), false)
            }
            FileColumn::Sha256(_) => Field::new("sha256", DataType::Utf8, false),
            FileColumn::Tensor { key, fields } => Field::new(
                *key,
                DataType::Struct(tensor_struct_fields_of(fields)),
                true,
            ),
        }
    }
}

/// One row per file: for each key a Tensor Struct (null when the file has no such tensor).
/// The `data` bytes of one key column over the batch must stay within `i32::MAX`.
pub fn file_rows(files: &[&dyn TensorSource], keys: &[&str]) -> Result<RecordBatch, ReadError> {
    let schema = file_rows_schema(keys);
    let mut columns = vec![FileColumn::File];
    columns.extend(keys.iter().map(|key| FileColumn::Tensor {
        key,
        fields: &TensorField::ALL,
    }));
    columns.push(FileColumn::Metadata);
    let arrays = file_columns(files, &columns)?;
    let first = files.first().map(|s| s.name()).unwrap_or_default();
    RecordBatch::try_new(schema, arrays).map_err(|e| ReadErrorKind::from(e).in_file(&first))
}

/// The arrays of the per-file `columns` (typed as [`FileColumn::field`]), one row per file.
/// Only the `data` field reads data bytes; its bytes over the batch must stay within
/// `i32::MAX` per column.
pub fn file_columns(
    files: &[&dyn TensorSource],
    columns: &[FileColumn<'_>],
) -> Result<Vec<ArrayRef>, ReadError> {
    let names: Vec<_> = files.iter().map(|s| s.name()).collect();
    let first = names.first().map_or("", |n| n.as_ref()).to_owned();
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
    for column in columns {
        let array: ArrayRef = match column {
            FileColumn::File => Arc::new(StringArray::from_iter_values(
                names.iter().map(|n| n.as_ref()),
            )),
            FileColumn::Metadata => {
                metadata_column(files.iter().map(|s| s.header().metadata.as_ref()))
                    .map_err(|e| e.in_file(&first))?
            }
            FileColumn::Flags(fields) => {
                let all: Vec<Vec<Flag>> = files.iter().map(|s| flags_of(s.header())).collect();
                let refs: Vec<&[Flag]> = all.iter().map(Vec::as_slice).collect();
                flags_column(&refs, fields).map_err(|e| e.in_file(&first))?
            }
            FileColumn::ModelInfo(fields) => {
                let all: Vec<ModelInfo> = files.iter().map(|s| model_info_of(s.header())).collect();
                let refs: Vec<&ModelInfo> = all.iter().collect();
                model_info_column(&refs, fields).map_err(|e| e.in_file(&first))?
            }
            FileColumn::Sha256(digests) => {
                if digests.len() != files.len() {
                    return Err(ReadErrorKind::Invalid(format!(
                        "{} file digests for {} files",
                        digests.len(),
                        files.len()
                    ))
                    .in_file(&first));
                }
                Arc::new(StringArray::from_iter_values(digests.iter()))
            }
            FileColumn::Tensor { key, fields } => {
                let infos: Vec<Option<&TensorInfo>> =
                    files.iter().map(|s| s.header().tensor(key)).collect();
                let mut children: Vec<ArrayRef> = Vec::with_capacity(fields.len());
                for field in *fields {
                    children.push(match field {
                        TensorField::Data => {
                            let total: u64 = infos.iter().flatten().map(|t| t.byte_len()).sum();
                            if total > MAX_OFFSET {
                                return Err(too_large("data bytes", total).at(&first, key));
                            }
                            let mut data =
                                BinaryBuilder::with_capacity(files.len(), total as usize);
                            for (src, info) in files.iter().zip(&infos) {
                                match info {
                                    Some(t) => data.append_value(tensor_bytes(*src, t)?),
                                    None => data.append_value([]),
                                }
                            }
                            Arc::new(data.finish())
                        }
                        TensorField::Shape => {
                            shape_column(infos.iter().map(|i| i.map(|t| t.shape.as_slice())))
                        }
                        TensorField::Dtype => Arc::new(StringArray::from_iter_values(
                            infos.iter().map(|i| i.map_or("", |t| t.dtype.name())),
                        )),
                    });
                }
                let nulls = NullBuffer::from(infos.iter().map(Option::is_some).collect::<Vec<_>>());
                let s = if fields.is_empty() {
                    StructArray::new_empty_fields(files.len(), Some(nulls))
                } else {
                    StructArray::try_new(tensor_struct_fields_of(fields), children, Some(nulls))
                        .map_err(|e| ReadErrorKind::from(e).at(&first, key))?
                };
                Arc::new(s)
            }
        };
        arrays.push(array);
    }
    Ok(arrays)
}
