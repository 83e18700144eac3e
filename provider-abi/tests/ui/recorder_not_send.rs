// The recorder's callback runs on the provider's threads: it must be `Send`
// and own what it keeps.
#![forbid(unsafe_code)]
use provider_abi::{ready, CreationRecorder, HookFuture, Lease, RecordCreation};

struct Journal(std::rc::Rc<()>);

impl RecordCreation for Journal {
    fn sending(&mut self) -> HookFuture<()> {
        ready(Ok(()))
    }
    fn created(&mut self, _lease: &Lease) -> HookFuture<()> {
        ready(Ok(()))
    }
}

fn main() {
    let _ = CreationRecorder::new(Journal(std::rc::Rc::new(())));
}
