//! The log sink `setup` hands a provider: its log events, forwarded to the host.
//!
//! A provider's `tracing` events stay inside its library (each `cdylib` has
//! its own copy of `tracing`'s globals). In `setup` the host hands
//! the provider a [`LogSink`] and the most verbose level it wants; the
//! provider forwards each event at or above that level as a [`LogRecord`]
//! (level, target, message and fields as text), and the host re-emits it into
//! its own subscriber. Levels the host does not want are never formatted.

use crate::export::quietly;
use abi_stable::{
    std_types::{RSlice, RStr},
    StableAbi,
};
use std::ffi::c_void;

/// A log level, most severe first (`Error < Trace` in verbosity order).
#[repr(u8)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// Errors.
    Error = 1,
    /// Warnings.
    Warn = 2,
    /// Information.
    Info = 3,
    /// Debugging detail.
    Debug = 4,
    /// Tracing detail.
    Trace = 5,
}

impl LogLevel {
    /// The level's name in capitals (`WARN`).
    pub const fn name(self) -> &'static str {
        match self {
            LogLevel::Error => "ERROR",
            LogLevel::Warn => "WARN",
            LogLevel::Info => "INFO",
            LogLevel::Debug => "DEBUG",
            LogLevel::Trace => "TRACE",
        }
    }
}

/// One field of a log event, its value as text.
#[repr(C)]
#[derive(StableAbi, Copy, Clone, Debug)]
pub struct LogField<'a> {
    /// The field's name.
    pub name: RStr<'a>,
    /// The field's value, formatted as text.
    pub value: RStr<'a>,
}

/// One log event of the provider.
#[repr(C)]
#[derive(StableAbi, Copy, Clone, Debug)]
pub struct LogRecord<'a> {
    /// Its level.
    pub level: LogLevel,
    /// Its target (the provider's module path, e.g. `createos_provider::execute`).
    pub target: RStr<'a>,
    /// Its message.
    pub message: RStr<'a>,
    /// Its other fields, in order.
    pub fields: RSlice<'a, LogField<'a>>,
}

impl<'a> LogRecord<'a> {
    /// An event of `level` from `target` saying `message`, with `fields`.
    pub fn new(level: LogLevel, target: &'a str, message: &'a str, fields: &'a [LogField<'a>]) -> Self {
        LogRecord { level, target: target.into(), message: message.into(), fields: fields.into() }
    }
}

/// An FFI-safe callback receiving the provider's log events, for the rest of
/// the process (the provider may keep it in a global subscriber).
///
/// Unlike the output sinks it may be called from many threads at once. A
/// panic in the host's callback is caught at the boundary and the event
/// dropped.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct LogSink {
    context: *const c_void,
    log: unsafe extern "C" fn(*const c_void, &LogRecord<'_>),
}

// SAFETY: `new` only accepts `Send + Sync + 'static` callbacks, called through `&`.
unsafe impl Send for LogSink {}
// SAFETY: as above.
unsafe impl Sync for LogSink {}

impl LogSink {
    /// A sink calling `callback(record)` for every event. The callback is
    /// leaked: a provider may call it until the process ends (libraries are
    /// never unloaded), so build one sink per loaded provider, not per call.
    pub fn new<F>(callback: F) -> Self
    where
        F: Fn(&LogRecord<'_>) + Send + Sync + 'static,
    {
        unsafe extern "C" fn trampoline<F>(context: *const c_void, record: &LogRecord<'_>)
        where
            F: Fn(&LogRecord<'_>) + Send + Sync + 'static,
        {
            // SAFETY: `context` is the leaked `&'static F` made by `new`.
            let callback = unsafe { &*context.cast::<F>() };
            quietly(|| callback(record));
        }
        let leaked: &'static F = Box::leak(Box::new(callback));
        Self { context: (leaked as *const F).cast(), log: trampoline::<F> }
    }

    /// Delivers one event to the host.
    pub fn log(&self, record: &LogRecord<'_>) {
        // SAFETY: `context` and `log` were paired by `new` (private fields)
        // and `context` lives for the rest of the process.
        unsafe { (self.log)(self.context, record) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn records_reach_the_callback_and_panics_stay_on_the_host_side() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&seen);
        let sink = LogSink::new(move |record: &LogRecord<'_>| {
            if record.message.as_str() == "boom" {
                panic!("host logger failed");
            }
            let fields: Vec<String> =
                record.fields.iter().map(|field| format!("{}={}", field.name, field.value)).collect();
            kept.lock().unwrap().push(format!(
                "{} {} {} {}",
                record.level.name(),
                record.target,
                record.message,
                fields.join(",")
            ));
        });
        let fields = [LogField { name: "sandbox".into(), value: "sb-1".into() }];
        for message in ["first", "boom", "second"] {
            sink.log(&LogRecord::new(LogLevel::Debug, "createos_provider::execute", message, &fields));
        }
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "DEBUG createos_provider::execute first sandbox=sb-1",
                "DEBUG createos_provider::execute second sandbox=sb-1"
            ]
        );
    }
}
