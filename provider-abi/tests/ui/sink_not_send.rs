// A byte sink is written from the provider's threads: its closure must be `Send`.
#![forbid(unsafe_code)]
use provider_abi::{ByteSink, OutputStream};

fn main() {
    let shared = std::rc::Rc::new(());
    let _not_send = ByteSink::new(move |_: OutputStream, _: &[u8]| drop(shared.clone()));
}
