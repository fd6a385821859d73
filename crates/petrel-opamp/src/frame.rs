//! The WebSocket message format: a varint header (0 in this version of
//! the protocol) followed by the protobuf message. Plain HTTP bodies are
//! the bare protobuf.

use prost::Message;

use crate::proto::{AgentToServer, ServerToAgent};

/// Why a message from the server was not decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The header is not a varint.
    NoHeader,
    /// The header is not 0: a later protocol version or garbage.
    BadHeader(u64),
    /// The data is not a `ServerToAgent` message.
    Malformed(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::NoHeader => f.write_str("the WebSocket message has no varint header"),
            FrameError::BadHeader(h) => write!(
                f,
                "the WebSocket message header is {h}, not 0 (OpAMP v0.18.0 defines only 0)"
            ),
            FrameError::Malformed(e) => write!(f, "not a ServerToAgent protobuf message: {e}"),
        }
    }
}

/// `msg` as one WebSocket message.
pub fn encode_ws(msg: &AgentToServer) -> Vec<u8> {
    let mut buf = Vec::with_capacity(1 + msg.encoded_len());
    buf.push(0);
    // Writing into a Vec cannot run out of room.
    let _ = msg.encode(&mut buf);
    buf
}

/// Decodes one WebSocket message from the server.
pub fn decode_ws(frame: &[u8]) -> Result<ServerToAgent, FrameError> {
    let mut b = frame;
    let header = prost::encoding::decode_varint(&mut b).map_err(|_| FrameError::NoHeader)?;
    if header != 0 {
        return Err(FrameError::BadHeader(header));
    }
    decode_http(b)
}

/// Decodes a plain HTTP response body.
pub fn decode_http(body: &[u8]) -> Result<ServerToAgent, FrameError> {
    ServerToAgent::decode(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ws_frames_round_trip_and_refuse_other_headers() {
        let reply = ServerToAgent {
            instance_uid: vec![7; 16],
            flags: 1,
            ..Default::default()
        };
        let mut frame = vec![0];
        reply.encode(&mut frame).unwrap();
        assert_eq!(decode_ws(&frame).unwrap(), reply);
        frame[0] = 5;
        assert_eq!(decode_ws(&frame), Err(FrameError::BadHeader(5)));
        assert_eq!(decode_ws(&[]), Err(FrameError::NoHeader));
        assert!(matches!(
            decode_ws(&[0, 0xff, 0xff, 0xff]),
            Err(FrameError::Malformed(_))
        ));
        let out = encode_ws(&AgentToServer {
            sequence_num: 3,
            ..Default::default()
        });
        assert_eq!(out[0], 0);
        assert_eq!(AgentToServer::decode(&out[1..]).unwrap().sequence_num, 3);
    }
}
