//! JSON-RPC 2.0 as Paperclip's worker manager speaks it: one JSON object a
//! line on stdin (from the host) and stdout (to it), UTF-8.
//!
//! [`Lines`] frames stdin with a bound on a line's length; [`parse`] sorts a
//! line into a request, a notification, a response (to a request of ours) or
//! an error to answer; [`success`], [`failure`] and [`notification`] build the
//! objects the worker writes.

use bytes::{Bytes, BytesMut};
use serde::Serialize;
use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::codec::{AnyDelimiterCodec, AnyDelimiterCodecError, Decoder};

/// The longest line the worker reads or writes: the host drops longer ones.
pub const MAX_LINE_BYTES: usize = 128 * 1024 * 1024;

/// The JSON-RPC error codes, and Paperclip's (`PLUGIN_RPC_ERROR_CODES`).
pub mod codes {
    /// The line is not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON is not a JSON-RPC 2.0 request.
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// The method's parameters do not have its shape.
    pub const INVALID_PARAMS: i64 = -32602;
    /// A fault of the worker itself.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// Paperclip: the worker is shutting down.
    pub const WORKER_UNAVAILABLE: i64 = -32000;
    /// Paperclip: the call failed in the worker (a hook's error).
    pub const WORKER_ERROR: i64 = -32002;
    /// Paperclip: a method of the protocol this worker's provider has no hook for.
    pub const METHOD_NOT_IMPLEMENTED: i64 = -32004;
}

/// An error answer: a code, a one-line message and optional data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RpcError {
    /// One of [`codes`].
    pub code: i64,
    /// What went wrong, one line.
    pub message: String,
    /// Structured detail (a hook error's kind, HTTP status and operation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    /// An error of `code` saying `message`.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), data: None }
    }

    /// `-32602`: the parameters of `method` do not have its shape.
    pub fn invalid_params(method: &str, problem: impl std::fmt::Display) -> Self {
        Self::new(codes::INVALID_PARAMS, format!("invalid params for {method}: {problem}"))
    }
}

/// One line from the host, sorted.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A call to answer. `invocation` is the id of the host's
    /// `paperclipInvocation`, which notifications sent during the call echo.
    Request { id: Value, method: String, params: Value, invocation: Option<String> },
    /// A notification: nothing to answer.
    Notification { method: String, params: Value },
    /// The host's answer to a request of the worker's.
    Response { id: Value },
    /// A line to answer with this error (`id` null when the line had none).
    Invalid { id: Value, error: RpcError },
}

/// Sorts one line (without its newline).
pub fn parse(line: &[u8]) -> Incoming {
    let invalid =
        |id: Value, code: i64, message: String| Incoming::Invalid { id, error: RpcError::new(code, message) };
    let value: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(error) => return invalid(Value::Null, codes::PARSE_ERROR, format!("parse error: {error}")),
    };
    let Value::Object(mut object) = value else {
        return invalid(Value::Null, codes::INVALID_REQUEST, "a message must be a JSON object".into());
    };
    let id = object.remove("id");
    let answer_to = id.clone().unwrap_or(Value::Null);
    if object.get("jsonrpc") != Some(&json!("2.0")) {
        return invalid(answer_to, codes::INVALID_REQUEST, "`jsonrpc` must be \"2.0\"".into());
    }
    if let Some(id) = &id {
        if !matches!(id, Value::String(_) | Value::Number(_)) {
            return invalid(Value::Null, codes::INVALID_REQUEST, "`id` must be a string or a number".into());
        }
    }
    let method = match object.remove("method") {
        Some(Value::String(method)) => method,
        Some(_) => return invalid(answer_to, codes::INVALID_REQUEST, "`method` must be a string".into()),
        None => {
            return match id {
                Some(id) if object.contains_key("result") || object.contains_key("error") => {
                    Incoming::Response { id }
                }
                _ => invalid(answer_to, codes::INVALID_REQUEST, "a request needs a `method`".into()),
            };
        }
    };
    let params = object.remove("params").unwrap_or(Value::Object(Map::new()));
    match id {
        Some(id) => {
            let invocation = object
                .get("paperclipInvocation")
                .and_then(|invocation| invocation.get("id"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            Incoming::Request { id, method, params, invocation }
        }
        None => Incoming::Notification { method, params },
    }
}

/// The answer to request `id` with `result`.
pub fn success(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The answer to request `id` (null when unknown) with `error`.
pub fn failure(id: Value, error: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

/// A notification of `method`, echoing the host's invocation id when the
/// worker sends it during that call.
pub fn notification(method: &str, params: Value, invocation: Option<&str>) -> Value {
    let mut message = json!({"jsonrpc": "2.0", "method": method, "params": params});
    if let Some(invocation) = invocation {
        message["paperclipInvocationId"] = json!(invocation);
    }
    message
}

/// A line longer than [`MAX_LINE_BYTES`] (skipped up to its newline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oversize;

/// The lines of a byte stream, each at most `max` bytes: a longer line is
/// reported once as [`Oversize`] and skipped, and the lines after it are read
/// as usual.
pub struct Lines<R> {
    input: R,
    codec: AnyDelimiterCodec,
    buffer: BytesMut,
    eof: bool,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    /// The lines of `input`, each at most `max` bytes.
    pub fn new(input: R, max: usize) -> Self {
        Self {
            input,
            codec: AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), Vec::new(), max),
            buffer: BytesMut::with_capacity(64 * 1024),
            eof: false,
        }
    }

    /// The next line without its newline (a last line without one too);
    /// `None` at the end of the input or on a read error.
    pub async fn next(&mut self) -> Option<Result<Bytes, Oversize>> {
        loop {
            let decoded = match self.eof {
                false => self.codec.decode(&mut self.buffer),
                true => self.codec.decode_eof(&mut self.buffer),
            };
            match decoded {
                Ok(Some(line)) => return Some(Ok(line)),
                Err(AnyDelimiterCodecError::MaxChunkLengthExceeded) => return Some(Err(Oversize)),
                Err(AnyDelimiterCodecError::Io(_)) => return None,
                Ok(None) if self.eof => return None,
                Ok(None) => {}
            }
            self.buffer.reserve(64 * 1024);
            match self.input.read_buf(&mut self.buffer).await {
                Ok(0) | Err(_) => self.eof = true,
                Ok(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_notifications_and_responses_are_told_apart() {
        let request = parse(
            br#"{"jsonrpc":"2.0","id":7,"method":"health","params":{},"paperclipInvocation":{"id":"inv-1","scope":{"companyId":"c"}}}"#,
        );
        assert_eq!(
            request,
            Incoming::Request {
                id: json!(7),
                method: "health".into(),
                params: json!({}),
                invocation: Some("inv-1".into())
            }
        );
        let notification = parse(br#"{"jsonrpc":"2.0","method":"onEvent","params":{"x":1}}"#);
        assert_eq!(
            notification,
            Incoming::Notification { method: "onEvent".into(), params: json!({"x": 1}) }
        );
        let response = parse(br#"{"jsonrpc":"2.0","id":"w-1","result":null}"#);
        assert_eq!(response, Incoming::Response { id: json!("w-1") });
        let string_id = parse(br#"{"jsonrpc":"2.0","id":"a","method":"m"}"#);
        assert!(matches!(string_id, Incoming::Request { id: Value::String(_), .. }), "{string_id:?}");
    }

    #[test]
    fn malformed_lines_get_the_json_rpc_codes() {
        let cases: [(&[u8], i64, Value); 7] = [
            (b"{not json", codes::PARSE_ERROR, Value::Null),
            (b"[1,2]", codes::INVALID_REQUEST, Value::Null),
            (br#"{"id":1,"method":"health"}"#, codes::INVALID_REQUEST, json!(1)),
            (br#"{"jsonrpc":"1.0","id":1,"method":"health"}"#, codes::INVALID_REQUEST, json!(1)),
            (br#"{"jsonrpc":"2.0","id":{"a":1},"method":"health"}"#, codes::INVALID_REQUEST, Value::Null),
            (br#"{"jsonrpc":"2.0","id":2,"method":5}"#, codes::INVALID_REQUEST, json!(2)),
            (br#"{"jsonrpc":"2.0","id":3}"#, codes::INVALID_REQUEST, json!(3)),
        ];
        for (line, code, id) in cases {
            match parse(line) {
                Incoming::Invalid { id: answered, error } => {
                    assert_eq!((answered, error.code), (id, code), "{}", String::from_utf8_lossy(line))
                }
                other => panic!("{} parsed as {other:?}", String::from_utf8_lossy(line)),
            }
        }
    }

    #[test]
    fn answers_and_notifications_have_the_protocol_shape() {
        assert_eq!(
            success(json!(1), json!({"ok": true})),
            json!({"jsonrpc": "2.0", "id": 1, "result": {"ok": true}})
        );
        let error = RpcError::new(codes::METHOD_NOT_IMPLEMENTED, "no");
        assert_eq!(
            failure(json!("x"), &error),
            json!({"jsonrpc": "2.0", "id": "x", "error": {"code": -32004, "message": "no"}})
        );
        assert_eq!(
            notification("execute.log", json!({"stream": "stdout", "chunk": "hi"}), Some("inv")),
            json!({"jsonrpc": "2.0", "method": "execute.log", "params": {"stream": "stdout", "chunk": "hi"}, "paperclipInvocationId": "inv"})
        );
        assert!(notification("log", json!({}), None).get("paperclipInvocationId").is_none());
    }

    #[tokio::test]
    async fn an_oversize_line_is_reported_once_and_the_next_line_is_read() {
        let input = format!("{}\n{}\nlast", "x".repeat(100), "y".repeat(10));
        let mut lines = Lines::new(input.as_bytes(), 16);
        assert_eq!(lines.next().await, Some(Err(Oversize)));
        assert_eq!(lines.next().await, Some(Ok(Bytes::from("y".repeat(10)))));
        assert_eq!(lines.next().await, Some(Ok(Bytes::from("last"))));
        assert_eq!(lines.next().await, None);
    }

    #[tokio::test]
    async fn lines_split_across_reads_are_joined() {
        let (mut writer, reader) = tokio::io::duplex(4);
        let feed = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            writer.write_all(b"{\"a\":1}\n{\"b\":").await.unwrap();
            writer.write_all(b"2}\n").await.unwrap();
        });
        let mut lines = Lines::new(reader, MAX_LINE_BYTES);
        assert_eq!(lines.next().await, Some(Ok(Bytes::from_static(b"{\"a\":1}"))));
        assert_eq!(lines.next().await, Some(Ok(Bytes::from_static(b"{\"b\":2}"))));
        feed.await.unwrap();
        assert_eq!(lines.next().await, None);
    }
}
