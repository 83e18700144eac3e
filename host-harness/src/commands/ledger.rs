//! `sweep` and `leases`: the lease ledger.

use super::{read_config, Failure, Printer, Session};
use host_harness::render::{cell, table};
use provider_host::{
    store::LedgerLocation,
    sweep::{self, Outcome, Scope, SweepSecrets},
};

/// The widest lease id `leases` shows; longer ones are shortened in the middle.
const LEASE_WIDTH: usize = 40;
/// The widest company/environment `leases` shows.
const ENV_WIDTH: usize = 40;
use std::path::PathBuf;

/// `sweep` options.
#[derive(clap::Args)]
pub struct SweepArgs {
    /// Configuration whose secrets are used for leases of the same
    /// account (else the provider's own fallback).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Also destroy leases held by the hook commands (`acquire`...).
    #[arg(long)]
    include_held: bool,
    /// Remove rows that name no sandbox, once checked by hand.
    #[arg(long)]
    forget_unresolvable: bool,
}

/// `sweep`: destroys every lease a crashed or interrupted run left behind
/// (held leases too with `include_held`); exit 1 if a destroy failed or a
/// row could not be resolved.
pub fn sweep(session: &Session, args: &SweepArgs) -> Result<(), Failure> {
    let config = args.config.as_deref().map(|path| read_config(path, &session.provider)).transpose()?;
    let secrets =
        config.map(|config| SweepSecrets::from_config(&session.provider, &config)).unwrap_or_default();
    let scope = Scope::Abandoned { include_held: args.include_held };
    let swept =
        sweep::sweep(&session.provider, session.ledger.as_ref(), scope, &secrets).map_err(Failure::usage)?;
    for item in &swept {
        let what = match &item.outcome {
            // A row whose creation request never left is closed without a
            // word: nothing can exist remotely.
            Outcome::NeverSent => continue,
            Outcome::Destroyed => "destroyed".to_owned(),
            Outcome::GoneWithItsProcess => "gone with its process (its API lived there)".to_owned(),
            Outcome::Unresolvable => {
                "unresolvable: its creation reply was still in flight when its run died".to_owned()
            }
            Outcome::Failed(error) => format!("FAILED: {}", host_harness::render::error_line(error)),
        };
        session.out.value(&item.to_json(), || {
            let lease = item.record.provider_lease_id.as_deref().unwrap_or("(no lease id)");
            format!("row {:>5} {:<14} {lease}: {what}", item.record.id, item.record.state)
        });
    }
    let count = |want: Outcome| swept.iter().filter(|item| item.outcome == want).count();
    let (destroyed, gone) = (count(Outcome::Destroyed), count(Outcome::GoneWithItsProcess));
    let unresolvable = count(Outcome::Unresolvable);
    let failed = swept.iter().filter(|item| matches!(item.outcome, Outcome::Failed(_))).count();
    let summary = serde_json::json!({
        "swept": true,
        "destroyed": destroyed,
        "goneWithItsProcess": gone,
        "unresolvable": unresolvable,
        "failed": failed,
    });
    session.out.value(&summary, || {
        format!("sweep: {destroyed} destroyed, {gone} gone with their process, {unresolvable} unresolvable, {failed} failed")
    });
    if args.forget_unresolvable {
        for item in swept.iter().filter(|item| item.outcome == Outcome::Unresolvable) {
            session.ledger.forget(item.record.id).map_err(Failure::usage)?;
        }
    } else if unresolvable > 0 {
        eprintln!(
            "sweep: {unresolvable} row(s) name no sandbox (a creation was in flight when its run died): \
             look for unnamed sandboxes in the provider's console, then remove the rows with `sweep --forget-unresolvable`"
        );
    }
    super::passed(failed == 0 && (unresolvable == 0 || args.forget_unresolvable))
}

/// `leases`: the ledger as a table, or one JSON object per row. Reads the
/// ledger without writing it (none yet: no rows).
pub fn leases(ledger: &LedgerLocation, out: Printer) -> Result<(), Failure> {
    let records = provider_host::store::read_all(ledger).map_err(Failure::usage)?;
    if out.json {
        for record in &records {
            out.value(&record.to_json(), String::new);
        }
        return Ok(());
    }
    let header = ["row", "state", "owner", "lease", "company/environment", "updated", "last error"];
    let rows = std::iter::once(header.iter().map(|title| (*title).to_owned()).collect())
        .chain(records.iter().map(|record| {
            vec![
                record.id.to_string(),
                record.state.as_str().to_owned(),
                record.owner.as_str().to_owned(),
                cell(record.provider_lease_id.as_deref().unwrap_or("-"), LEASE_WIDTH),
                cell(&format!("{}/{}", record.env.company_id, record.env.environment_id), ENV_WIDTH),
                cell(&record.updated_at.to_string(), ENV_WIDTH),
                cell(record.last_error.as_ref().and_then(|error| error["kind"].as_str()).unwrap_or(""), 32),
            ]
        }))
        .collect::<Vec<Vec<String>>>();
    for line in table(&rows) {
        out.value(&serde_json::Value::Null, || line.trim_end().to_owned());
    }
    Ok(())
}
