//! Exports of `io.safetensors.spark.jni.NativeTensorFunctions`: the tensor functions `arr_to_st` and
//! `st_to_array` (spec/functions.md, spec/jni.md §6). Glue only: the rules are
//! [`safetensors_spark_engine::tensor_functions`]'s. Every error is an `IllegalArgumentException` whose message names the
//! value, the shape or the dtype; stateless and thread-safe.

use ::jni::objects::{JByteArray, JClass, JLongArray, JString};
use ::jni::sys::jlong;
use ::jni::{Env, EnvUnowned};

use super::{arg, guard, JniError};
use safetensors_spark_engine::tensor_functions;

fn invalid(msg: String) -> JniError {
    JniError::InvalidArgument(msg)
}

fn bytes(env: &Env<'_>, b: &JByteArray<'_>, what: &str) -> Result<Vec<u8>, JniError> {
    if b.is_null() {
        return Err(invalid(format!("{what} must not be null")));
    }
    Ok(env.convert_byte_array(b)?)
}

fn longs(env: &Env<'_>, a: &JLongArray<'_>, what: &str) -> Result<Vec<jlong>, JniError> {
    if a.is_null() {
        return Err(invalid(format!("{what} must not be null")));
    }
    let mut out = vec![0; a.len(env)?];
    a.get_region(env, 0, &mut out)?;
    Ok(out)
}

/// `static native byte[] encode(byte[] values, String elementType, String dtype, long[] shape)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeTensorFunctions_encode<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    values: JByteArray<'local>,
    element: JString<'local>,
    dtype: JString<'local>,
    shape: JLongArray<'local>,
) -> JByteArray<'local> {
    guard(&mut env, |env| {
        let values = bytes(env, &values, "values")?;
        let element = arg(env, &element, "elementType")?;
        let dtype = arg(env, &dtype, "dtype")?;
        let shape = longs(env, &shape, "shape")?;
        let out = tensor_functions::encode(&values, &element, &dtype, &shape).map_err(invalid)?;
        Ok(env.byte_array_from_slice(&out)?)
    })
}

/// `static native byte[] decode(byte[] data, String dtype, long[] shape, String elementType)`
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeTensorFunctions_decode<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    data: JByteArray<'local>,
    dtype: JString<'local>,
    shape: JLongArray<'local>,
    element: JString<'local>,
) -> JByteArray<'local> {
    guard(&mut env, |env| {
        let data = bytes(env, &data, "data")?;
        let dtype = arg(env, &dtype, "dtype")?;
        let shape = longs(env, &shape, "shape")?;
        let element = arg(env, &element, "elementType")?;
        let out = tensor_functions::decode(&data, &dtype, &shape, &element).map_err(invalid)?;
        Ok(env.byte_array_from_slice(&out)?)
    })
}

/// `static native String writableDtype(String name)`: the canonical name of a dtype argument
/// (case-insensitive, writable dtypes only).
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeTensorFunctions_writableDtype<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    name: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let name = arg(env, &name, "dtype")?;
        let d = tensor_functions::writable_dtype(&name).map_err(invalid)?;
        Ok(env.new_string(d.name())?)
    })
}

/// `static native String naturalDtype(String elementType)`: the writer's natural dtype of a
/// Spark element type (`"float"` → `"F32"`).
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeTensorFunctions_naturalDtype<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    element: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let element = arg(env, &element, "elementType")?;
        let d = tensor_functions::natural_dtype(&element).map_err(invalid)?;
        Ok(env.new_string(d.name())?)
    })
}

/// `static native String elementType(String dtype)`: the Spark element type a writable dtype
/// reads back as (`"U8"` → `"short"`; case-insensitive).
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeTensorFunctions_elementType<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    dtype: JString<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        let dtype = arg(env, &dtype, "dtype")?;
        let d = tensor_functions::writable_dtype(&dtype).map_err(invalid)?;
        let e = tensor_functions::element_of(d).map_err(invalid)?;
        Ok(env.new_string(e)?)
    })
}
