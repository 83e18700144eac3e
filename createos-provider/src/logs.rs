//! Forwards the provider's `tracing` events to the host's log sink (the
//! one `setup` receives).
//!
//! Inside the `cdylib` this crate has its own copy of `tracing`'s globals, so
//! its events reach nobody unless a subscriber is installed here. [`install`]
//! installs one, once per process: a `tracing_subscriber` registry with
//! [`Forward`], a layer that hands each event to the current [`LogSink`]. The
//! layer reports the host's level as its `max_level_hint`, so `tracing`'s
//! static level check rejects a disabled event before its fields are
//! evaluated (the `hooks` benchmark measures it). Used as an `rlib` inside a
//! host that has a subscriber of its own, the install is refused and the
//! events already reach the host directly.

use provider_abi::{abi_stable::std_types::RStr, LogField, LogLevel, LogRecord, LogSink};
use std::sync::{
    atomic::{AtomicU8, Ordering},
    Once, RwLock,
};
use tracing::{field::Field, level_filters::LevelFilter, Event, Level, Metadata, Subscriber};
use tracing_subscriber::{layer::Context, prelude::*, Layer};

/// The host's sink, replaced by every `setup`.
static SINK: RwLock<Option<LogSink>> = RwLock::new(None);
/// The most verbose level the host wants, as a [`LogLevel`] number.
static MAX_LEVEL: AtomicU8 = AtomicU8::new(0);
static INSTALL: Once = Once::new();

/// Sends the provider's events at `max_level` or more severe to `sink`.
pub fn install(sink: LogSink, max_level: LogLevel) {
    *SINK.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(sink);
    MAX_LEVEL.store(max_level as u8, Ordering::Relaxed);
    INSTALL.call_once(|| {
        let _refused_when_the_host_shares_our_tracing =
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Forward));
    });
    // The level may have changed since the callsites cached their interest.
    tracing::callsite::rebuild_interest_cache();
}

fn wanted() -> LevelFilter {
    match MAX_LEVEL.load(Ordering::Relaxed) {
        1 => LevelFilter::ERROR,
        2 => LevelFilter::WARN,
        3 => LevelFilter::INFO,
        4 => LevelFilter::DEBUG,
        5 => LevelFilter::TRACE,
        _ => LevelFilter::OFF,
    }
}

fn abi_level(level: Level) -> LogLevel {
    match level {
        Level::ERROR => LogLevel::Error,
        Level::WARN => LogLevel::Warn,
        Level::INFO => LogLevel::Info,
        Level::DEBUG => LogLevel::Debug,
        _ => LogLevel::Trace,
    }
}

/// The layer handing events to the host's sink.
struct Forward;

impl<S: Subscriber> Layer<S> for Forward {
    fn enabled(&self, metadata: &Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        // The libraries underneath (HTTP, TLS) log requests and frames at
        // DEBUG and TRACE; only their warnings and errors leave the provider,
        // so no header or body of theirs can reach the host's logs.
        let ours = metadata.target().starts_with(env!("CARGO_CRATE_NAME"));
        wanted() >= *metadata.level() && (ours || *metadata.level() <= Level::INFO)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(wanted())
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let guard = SINK.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(sink) = guard.as_ref() else { return };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let pairs: Vec<LogField<'_>> = fields
            .fields
            .iter()
            .map(|(name, value)| LogField { name: RStr::from_str(name), value: RStr::from_str(value) })
            .collect();
        let metadata = event.metadata();
        sink.log(&LogRecord::new(abi_level(*metadata.level()), metadata.target(), &fields.message, &pairs));
    }
}

/// An event's message and its other fields as text.
#[derive(Default)]
struct Fields {
    message: String,
    fields: Vec<(&'static str, String)>,
}

impl Fields {
    fn put(&mut self, field: &Field, text: String) {
        match field.name() {
            "message" => self.message.push_str(&text),
            name => self.fields.push((name, text)),
        }
    }
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}"));
    }
}
