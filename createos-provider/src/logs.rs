//! Forwards the provider's `tracing` events to the host's log sink (the
//! one `setup` receives).
//!
//! Inside the `cdylib` this crate has its own copy of `tracing`'s globals, so
//! its events reach nobody unless a subscriber is installed here. [`install`]
//! installs one, once per process: a `tracing_subscriber` registry with a
//! [`Targets`] filter behind a reload handle (each `setup` sets the host's
//! level) and [`Forward`], a layer that hands each event to the current
//! [`LogSink`]. The filter reports the host's level as its
//! `max_level_hint`, so `tracing`'s static level check rejects a disabled
//! event before its fields are evaluated (the `hooks` benchmark measures
//! it). Used as an `rlib` inside a host that has a subscriber of its own,
//! the install is refused and the events already reach the host directly.

use provider_abi::{abi_stable::std_types::RStr, LogField, LogLevel, LogRecord, LogSink};
use std::sync::{OnceLock, RwLock};
use tracing::{field::Field, level_filters::LevelFilter, Event, Level, Subscriber};
use tracing_subscriber::{filter::Targets, layer::Context, prelude::*, reload, Layer, Registry};

/// The host's sink, replaced by every `setup`.
static SINK: RwLock<Option<LogSink>> = RwLock::new(None);

/// Sends the provider's events at `max_level` or more severe to `sink`.
pub fn install(sink: LogSink, max_level: LogLevel) {
    *SINK.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(sink);
    static FILTER: OnceLock<reload::Handle<Targets, Registry>> = OnceLock::new();
    let filter = FILTER.get_or_init(|| {
        let (filter, handle) = reload::Layer::new(Targets::new());
        let _refused_when_the_host_shares_our_tracing = tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(filter).with(Forward),
        );
        handle
    });
    let wanted = level_filter(max_level);
    // The libraries underneath (HTTP, TLS) log requests and frames at DEBUG
    // and TRACE; only their warnings and errors leave the provider, so no
    // header or body of theirs can reach the host's logs. (A reload rebuilds
    // the interest the callsites cached for the old level.)
    let targets = Targets::new()
        .with_target(env!("CARGO_CRATE_NAME"), wanted)
        .with_default(wanted.min(LevelFilter::INFO));
    let _never_fails_while_the_subscriber_lives = filter.reload(targets);
}

fn level_filter(level: LogLevel) -> LevelFilter {
    match level {
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Trace => LevelFilter::TRACE,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn the_hosts_level_applies_to_ours_and_at_most_info_to_the_libraries_underneath() {
        static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
        let sink = LogSink::new(|record| {
            let message = record.message.as_str();
            if message.starts_with("logs test") {
                SEEN.lock().unwrap().push(format!("{} {} {message}", record.level.name(), record.target));
            }
        });
        install(sink, LogLevel::Debug);
        tracing::debug!("logs test: ours");
        tracing::debug!(target: "hyper::proto", "logs test: a frame");
        tracing::info!(target: "hyper::proto", "logs test: a connection");
        install(sink, LogLevel::Warn);
        tracing::info!("logs test: ours again");
        tracing::warn!(target: "rustls", "logs test: a warning");
        assert_eq!(
            *SEEN.lock().unwrap(),
            [
                "DEBUG createos_provider::logs::tests logs test: ours",
                "INFO hyper::proto logs test: a connection",
                "WARN rustls logs test: a warning",
            ]
        );
    }
}
