//! A hook's error in Paperclip's error shape.
//!
//! The message is the provider's, unchanged (users search for it, and
//! Paperclip's own type guards match it); the code is Paperclip's
//! `WORKER_ERROR` (what its SDK answers for an error a plugin throws), or
//! `METHOD_NOT_IMPLEMENTED` for a hook the provider does not have; `data`
//! carries what a caller branches on: the error's kind, HTTP status and
//! operation label (never a response body or the key: a provider's errors
//! carry neither).

use crate::rpc::{codes, RpcError};
use provider_abi::{ErrorKind, ProviderError};

/// `error` as Paperclip receives it.
pub fn rpc_error(error: &ProviderError) -> RpcError {
    let code = match error.kind {
        ErrorKind::UNSUPPORTED => codes::METHOD_NOT_IMPLEMENTED,
        _ => codes::WORKER_ERROR,
    };
    RpcError { code, message: error.message.to_string(), data: Some(provider_host::error_json(error)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_message_is_the_providers_word_for_word() {
        let seed = "CreateOS process cleanup is unconfirmed; destroy this lease before reusing it.";
        let error = rpc_error(&ProviderError::new(ErrorKind::CLEANUP_UNCONFIRMED, seed));
        assert_eq!(error.code, codes::WORKER_ERROR);
        assert_eq!(error.message, seed);
        assert_eq!(error.data.as_ref().unwrap()["kind"], json!("cleanup_unconfirmed"));
        let unsupported = rpc_error(&ProviderError::new(ErrorKind::UNSUPPORTED, "no sync"));
        assert_eq!(unsupported.code, codes::METHOD_NOT_IMPLEMENTED);
    }
}
