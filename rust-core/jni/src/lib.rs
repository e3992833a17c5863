//! JNI bridge: the native library the JVM connector loads (`libsafetensors_spark.so`), the only
//! crate of the workspace that uses the `jni` crate.
//!
//! Java side: the classes of `io.safetensors.spark.jni` (jvm-connector) declare the natives as
//! `static native` methods, one class per module here: `NativeWriter` (`writer_api`),
//! `NativeReader` (`reader_api`), `NativeVersions` (`versions_api`), `NativeCompaction`
//! (`compaction_api`), `NativeNames` (`names_api`), `NativeTensorFunctions`
//! (`tensor_functions_api`); `NativeLib` loads the library and holds `version`/`selfTest`. Symbol
//! names must match `Java_<package>_<Class>_<method>`.
//!
//! Rules for every exported function:
//! * its body is exactly one [`guard`] call, so no Rust panic or error ever unwinds into the JVM
//!   (a panic escaping an `extern "system"` fn aborts the process, i.e. kills the executor);
//! * errors are [`JniError`]s, whose variant chooses the Java exception class (the `error`
//!   module: options, format, dataset and data errors each have their own class, so the JVM
//!   catches by type and never matches message text); the message is the error's `Display`;
//! * if a Java exception is already pending nothing new is thrown (the pending one wins);
//! * on error/panic the function returns `T::default()` (0 / false / null), which the JVM
//!   ignores because an exception is pending.
//!
//! Native state that must outlive a call is passed to Java as a `long` handle, see
//! [`into_handle`], [`handle_mut`] and [`take_handle`].

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ::jni::errors::{Error as JniCrateError, ErrorPolicy};
use ::jni::objects::{JClass, JObjectArray, JString};
use ::jni::strings::JNIString;
use ::jni::sys::{jint, jlong};
use ::jni::{jni_str, Env, EnvUnowned};

mod compaction_api;
mod error;
mod log_api;
mod names_api;
mod reader_api;
mod tensor_functions_api;
mod versions_api;
mod writer_api;

pub use error::{exception_for, panic_message, JavaException, JniError, PANIC_MESSAGE_PREFIX};

/// Throws `class(msg)` unless an exception is already pending. If the class cannot be
/// found/instantiated (e.g. a broken jar), falls back to `java.lang.RuntimeException` so that
/// the original message still reaches Java.
fn throw_unless_pending(env: &mut Env<'_>, class: JavaException, msg: &str) {
    if env.exception_check() {
        return;
    }
    let jmsg = JNIString::from(msg);
    // Raw JNI `FindClass` inside a native method resolves through the class loader that defined
    // the native method's class (NativeLib), i.e. the loader of our jar even under
    // `--jars`/isolated loaders. (`throw_new(&str, ..)` would try the thread's context class
    // loader first, which can hold a different copy of our exception class.)
    if let Ok(class_ref) = env.find_class(class.jni_class_name()) {
        // `throw_new` reports success as `Err(Error::JavaException)` (an exception is pending).
        if let Err(JniCrateError::JavaException) = env.throw_new(&class_ref, &jmsg) {
            return;
        }
    }
    if env.exception_check() {
        // Constructing the exception threw something else: keep that one.
        return;
    }
    let fallback = JNIString::from(format!("{} (could not throw {})", msg, class.class_name()));
    let _ = env.throw_new(jni_str!("java/lang/RuntimeException"), &fallback);
}

/// [`ErrorPolicy`] of the bridge: maps [`JniError`] / panics to our Java exceptions and
/// returns `T::default()`. Panics inside the policy itself are caught by `jni` (it then logs
/// and returns the default).
#[derive(Debug, Default)]
pub struct ThrowMappedAndDefault;

impl<T: Default> ErrorPolicy<T, JniError> for ThrowMappedAndDefault {
    type Captures<'unowned_env_local: 'native_method, 'native_method> = ();

    fn on_error<'unowned_env_local: 'native_method, 'native_method>(
        env: &mut Env<'unowned_env_local>,
        _cap: &mut Self::Captures<'unowned_env_local, 'native_method>,
        err: JniError,
    ) -> ::jni::errors::Result<T> {
        let (class, msg) = exception_for(&err);
        throw_unless_pending(env, class, &msg);
        Ok(T::default())
    }

    fn on_panic<'unowned_env_local: 'native_method, 'native_method>(
        env: &mut Env<'unowned_env_local>,
        _cap: &mut Self::Captures<'unowned_env_local, 'native_method>,
        payload: Box<dyn Any + Send + 'static>,
    ) -> ::jni::errors::Result<T> {
        let msg = panic_message(payload.as_ref());
        // Dropping a payload can itself panic; never let that escape (leak it instead).
        if let Err(drop_panic) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
            std::mem::forget(drop_panic);
        }
        throw_unless_pending(env, JavaException::Safetensors, &msg);
        Ok(T::default())
    }
}

/// Runs the body of an exported function: `f` runs under `catch_unwind` (inside
/// `EnvUnowned::with_env`); an `Err` or a panic is thrown as the mapped Java exception (unless
/// one is already pending) and `T::default()` is returned.
pub fn guard<'local, T, F>(env: &mut EnvUnowned<'local>, f: F) -> T
where
    T: Default,
    F: FnOnce(&mut Env<'local>) -> Result<T, JniError>,
{
    env.with_env(f).resolve::<ThrowMappedAndDefault>()
}

// ---------------------------------------------------------------------------------------------
// Argument and result helpers shared by the exports

/// A data/format/IO error as a [`JniError::Failed`].
pub(crate) fn failed(e: impl std::fmt::Display) -> JniError {
    JniError::failed(e.to_string())
}

/// A Java `String[]` of `texts` (several texts returned apart, none escaped into JSON).
pub(crate) fn string_array<'local>(
    env: &mut Env<'local>,
    texts: &[&str],
) -> Result<JObjectArray<'local, JString<'local>>, JniError> {
    let array = JObjectArray::<JString>::new(env, texts.len(), JString::null())?;
    for (i, text) in texts.iter().enumerate() {
        let s = env.new_string(text)?;
        array.set_element(env, i, &s)?;
    }
    Ok(array)
}

/// A required (non-null) Java string argument.
pub(crate) fn arg(env: &Env<'_>, s: &JString<'_>, what: &str) -> Result<String, JniError> {
    if s.is_null() {
        return Err(JniError::invalid_argument(format!(
            "{what} must not be null"
        )));
    }
    Ok(s.try_to_string(env)?)
}

/// A JSON argument; malformed JSON is an invalid argument naming `what`.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    text: &str,
    what: &str,
) -> Result<T, JniError> {
    serde_json::from_str(text)
        .map_err(|e| JniError::invalid_argument(format!("{what}: invalid JSON: {e}")))
}

pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> Result<String, JniError> {
    serde_json::to_string(value).map_err(|e| JniError::failed(format!("JSON encoding: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Handles: Box<T> <-> jlong

/// Moves `value` to the heap and returns its address as a Java `long` (never 0).
/// Release it exactly once with [`take_handle`] using the same `T`.
pub fn into_handle<T>(value: T) -> jlong {
    Box::into_raw(Box::new(value)) as jlong
}

fn handle_ptr<T>(handle: jlong) -> Result<*mut T, JniError> {
    if handle == 0 {
        return Err(JniError::invalid_argument(
            "native handle is 0 (not open or already closed)",
        ));
    }
    Ok(handle as *mut T)
}

/// Borrows the value behind a handle; 0 is rejected with [`JniError::InvalidArgument`].
///
/// # Safety
/// `handle` must be 0 or a value returned by [`into_handle::<T>`] that has not been passed to
/// [`take_handle`] yet, and no other reference to the value may be alive (the Java owner must
/// serialise calls on one handle).
pub unsafe fn handle_mut<'a, T>(handle: jlong) -> Result<&'a mut T, JniError> {
    let ptr = handle_ptr::<T>(handle)?;
    // SAFETY: non-null and, per the contract, a live Box<T> allocation with no other borrow.
    Ok(unsafe { &mut *ptr })
}

/// Takes back ownership of the value behind a handle (dropping the result frees it); 0 is
/// rejected with [`JniError::InvalidArgument`].
///
/// # Safety
/// `handle` must be 0 or a value returned by [`into_handle::<T>`] that has not been taken yet;
/// after this call the handle is dangling and must not be used again.
pub unsafe fn take_handle<T>(handle: jlong) -> Result<Box<T>, JniError> {
    let ptr = handle_ptr::<T>(handle)?;
    // SAFETY: per the contract, `ptr` came from Box::into_raw and is released only once.
    Ok(unsafe { Box::from_raw(ptr) })
}

// ---------------------------------------------------------------------------------------------
// Exports of io.safetensors.spark.jni.NativeLib

/// Value returned by `selfTest(0)`, so Java can tell success from the default 0.
pub const SELF_TEST_OK: jint = 0x5AFE;

/// `static native String version()`: the crate version; the JVM refuses a mismatch.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeLib_version<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
) -> JString<'local> {
    guard(&mut env, |env| {
        Ok(env.new_string(safetensors_spark_format::VERSION)?)
    })
}

/// `static native long nativeLiveBytes()`: bytes the Rust engine has allocated and not freed in
/// this process (`safetensors_spark_format::alloc_stats`), for leak soaks and monitoring.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeLib_nativeLiveBytes<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
) -> jlong {
    guard(&mut env, |_env| {
        Ok(
            jlong::try_from(safetensors_spark_format::alloc_stats::live_bytes())
                .unwrap_or(jlong::MAX),
        )
    })
}

/// `static native int selfTest(int mode)`: test hook for the error path.
/// 0 returns [`SELF_TEST_OK`], 1 fails with an invalid-argument error, 2 panics.
#[no_mangle]
pub extern "system" fn Java_io_safetensors_spark_jni_NativeLib_selfTest<'local>(
    mut env: EnvUnowned<'local>,
    _class: JClass<'local>,
    mode: jint,
) -> jint {
    guard(&mut env, |_env| self_test(mode))
}

// A deliberate panic: mode 2 exists only to prove that a Rust panic becomes a Java exception
// and the JVM survives. Nothing else in the crate may panic (clippy::panic is denied).
#[allow(clippy::panic)]
fn self_test(mode: jint) -> Result<jint, JniError> {
    match mode {
        0 => Ok(SELF_TEST_OK),
        1 => Err(JniError::invalid_argument(
            "selfTest: invalid argument requested (mode 1)",
        )),
        2 => panic!("selfTest: panic requested (mode 2)"),
        other => Err(JniError::invalid_argument(format!(
            "selfTest: unknown mode {other} (expected 0, 1 or 2)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_messages_keep_str_and_string_payloads() {
        let p = catch_unwind(|| self_test(2)).err();
        let msg = p.as_deref().map(panic_message);
        assert_eq!(
            msg.as_deref(),
            Some("internal error (Rust panic): selfTest: panic requested (mode 2)")
        );
        let boxed: Box<dyn Any + Send> = Box::new(String::from("formatted 7"));
        assert_eq!(
            panic_message(boxed.as_ref()),
            "internal error (Rust panic): formatted 7"
        );
        let boxed: Box<dyn Any + Send> = Box::new(7_u8);
        assert!(panic_message(boxed.as_ref()).ends_with("non-string panic payload"));
    }

    #[test]
    fn self_test_modes() {
        assert!(matches!(self_test(0), Ok(SELF_TEST_OK)));
        assert!(matches!(self_test(1), Err(JniError::InvalidArgument(_))));
        assert!(matches!(self_test(9), Err(JniError::InvalidArgument(_))));
    }

    #[test]
    fn handles_round_trip_and_reject_zero() {
        let h = into_handle(vec![1_u32, 2, 3]);
        assert_ne!(h, 0);
        // SAFETY: h was just created from a Vec<u32> and is taken exactly once below.
        unsafe {
            if let Ok(v) = handle_mut::<Vec<u32>>(h) {
                v.push(4);
            }
            let back = take_handle::<Vec<u32>>(h).ok().map(|b| *b);
            assert_eq!(back, Some(vec![1, 2, 3, 4]));
            assert!(matches!(
                handle_mut::<Vec<u32>>(0),
                Err(JniError::InvalidArgument(_))
            ));
            assert!(matches!(
                take_handle::<Vec<u32>>(0),
                Err(JniError::InvalidArgument(_))
            ));
        }
    }
}
