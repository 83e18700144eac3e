//! A forged provider library whose ABI 1.9 hook table points outside it
//! (see `forged/table.rs`), for `tests/forged_module.rs`.
mod forged;

#[abi_stable::export_root_module]
fn provider_root_module() -> forged::frozen::ProviderModuleRef {
    forged::table::root_module::<9>()
}
