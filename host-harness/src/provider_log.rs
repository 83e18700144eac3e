//! The provider's log events in the host's subscriber.
//!
//! [`emit`] is what the host's [`LogSink`](provider_abi::LogSink) for
//! `setup` calls: each record the provider forwards is re-emitted as a
//! `tracing` event of the host, with the provider's level, target, message and fields, so the
//! host's filter (`-v`, `RUST_LOG=createos_provider=debug`) and format apply
//! to it as to the host's own events.
//!
//! `tracing` wants `'static` metadata, and a provider's targets and field
//! names arrive at run time, so each distinct (level, target, field names)
//! gets one leaked callsite, registered once; at most [`MAX_CALLSITES`] of
//! them, after which events go to the `provider` target with their fields
//! in the message. Hand-written because `tracing-log`'s bridge keeps the
//! target in a field, which `EnvFilter` directives do not match.

use provider_abi::{LogLevel, LogRecord};
use std::{
    collections::HashMap,
    fmt::Write,
    sync::{Mutex, OnceLock, RwLock},
};
use tracing::{
    field::{display, Value},
    level_filters::LevelFilter,
    Level, Metadata,
};
use tracing_core::{
    callsite::{Callsite, Identifier},
    field::FieldSet,
    metadata::Kind,
    subscriber::Interest,
    Event,
};

/// Distinct callsites kept before events fall back to the `provider` target.
pub const MAX_CALLSITES: usize = 1024;
/// Fields re-emitted as fields; more go into the message.
const MAX_FIELDS: usize = 8;

/// The most verbose level the host's subscriber wants, `None` when it wants
/// none: what `setup` passes so disabled levels cost nothing.
pub fn host_max_level() -> Option<LogLevel> {
    let current = LevelFilter::current();
    LEVELS.into_iter().find(|(level, _)| current >= *level).map(|(_, level)| level)
}

/// The host's level of each provider level, the most verbose first.
const LEVELS: [(Level, LogLevel); 5] = [
    (Level::TRACE, LogLevel::Trace),
    (Level::DEBUG, LogLevel::Debug),
    (Level::INFO, LogLevel::Info),
    (Level::WARN, LogLevel::Warn),
    (Level::ERROR, LogLevel::Error),
];

/// A watcher of every provider record that reaches the host (the soak's
/// secret scan): called with the record's target, message and fields as one
/// line of text.
pub type Observer = Box<dyn Fn(&str) + Send + Sync>;

/// The observer set, if any.
static OBSERVER: RwLock<Option<Observer>> = RwLock::new(None);

/// Calls `observer` with every provider record from now on, instead of the
/// one set before (`None`: no more).
pub fn observe(observer: Option<Observer>) {
    *OBSERVER.write().unwrap_or_else(|p| p.into_inner()) = observer;
}

/// Re-emits one provider record as a host event.
pub fn emit(record: &LogRecord<'_>) {
    if let Some(observer) = &*OBSERVER.read().unwrap_or_else(|p| p.into_inner()) {
        let mut line = format!("{} {}", record.target, record.message);
        for field in record.fields.iter() {
            let _ = write!(line, " {}={}", field.name, field.value);
        }
        observer(&line);
    }
    let level =
        LEVELS.into_iter().find(|(_, level)| *level == record.level).map_or(Level::ERROR, |(level, _)| level);
    if LevelFilter::current() < level {
        return;
    }
    let names: Vec<&str> = record.fields.iter().take(MAX_FIELDS).map(|field| field.name.as_str()).collect();
    let (callsite, fielded) = match callsite(level, record.target.as_str(), &names) {
        Some(callsite) => (callsite, names.len()),
        None => (callsite(level, "provider", &[]).expect("the fallback callsite always fits"), 0),
    };
    let metadata = callsite.metadata();
    if !tracing::dispatcher::get_default(|dispatch| dispatch.enabled(metadata)) {
        return;
    }
    let mut message = record.message.to_string();
    for field in record.fields.iter().skip(fielded) {
        let _ = write!(message, " {}={}", field.name, field.value);
    }
    let fields: Vec<_> = metadata.fields().iter().collect();
    let shown: Vec<_> =
        record.fields.iter().take(fielded).map(|field| display(field.value.as_str())).collect();
    let values: Vec<&dyn Value> = std::iter::once(&message as &dyn Value)
        .chain(shown.iter().map(|value| value as &dyn Value))
        .collect();
    // A value set is an array of one length: past the callsite's own
    // fields, the message field again, without a value.
    let pairs: [(&tracing_core::Field, Option<&dyn Value>); MAX_FIELDS + 1] =
        std::array::from_fn(|at| (fields.get(at).unwrap_or(&fields[0]), values.get(at).copied()));
    Event::dispatch(metadata, &metadata.fields().value_set(&pairs));
}

/// A callsite made at run time for one (level, target, field names).
struct ProviderCallsite {
    metadata: OnceLock<Metadata<'static>>,
}

impl Callsite for ProviderCallsite {
    fn set_interest(&self, _interest: Interest) {}

    fn metadata(&self) -> &Metadata<'_> {
        self.metadata.get().expect("the metadata is set before the callsite is registered")
    }
}

type Key = (Level, String, Vec<String>);

/// The callsite of `(level, target, names)`, made and registered on first
/// use; `None` once [`MAX_CALLSITES`] exist.
fn callsite(level: Level, target: &str, names: &[&str]) -> Option<&'static ProviderCallsite> {
    static CALLSITES: OnceLock<Mutex<HashMap<Key, &'static ProviderCallsite>>> = OnceLock::new();
    let mut callsites = CALLSITES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    let key: Key = (level, target.to_owned(), names.iter().map(|name| (*name).to_owned()).collect());
    if let Some(callsite) = callsites.get(&key) {
        return Some(callsite);
    }
    if callsites.len() >= MAX_CALLSITES && target != "provider" {
        return None;
    }
    let callsite: &'static ProviderCallsite =
        Box::leak(Box::new(ProviderCallsite { metadata: OnceLock::new() }));
    let leak = |text: &str| -> &'static str { Box::leak(text.to_owned().into_boxed_str()) };
    let field_names: Vec<&'static str> =
        std::iter::once("message").chain(names.iter().map(|name| leak(name))).collect();
    let field_names: &'static [&'static str] = Box::leak(field_names.into_boxed_slice());
    let metadata = Metadata::new(
        "provider event",
        leak(target),
        level,
        None,
        None,
        None,
        FieldSet::new(field_names, Identifier(callsite)),
        Kind::EVENT,
    );
    let _ = callsite.metadata.set(metadata);
    tracing_core::callsite::register(callsite);
    callsites.insert(key, callsite);
    Some(callsite)
}
