//! The cluster-bus message decoder (`cluster::wire::decode`): bytes from another node. Any
//! bytes are refused or decode to a message whose encoding is exactly those bytes; every
//! valid message survives encode → decode.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use member::cluster::wire::{decode, encode, Answer, Message, Op, Rebuild, Request};

#[derive(Arbitrary, Debug)]
enum Input {
    Raw(Vec<u8>),
    Request {
        id: u64,
        op: u8,
        set: String,
        entity: String,
        scope: String,
        expires_at: Option<f64>,
    },
    Answer {
        id: u64,
        kind: u8,
        n: i64,
        text: String,
    },
    Rebuild {
        id: u64,
        set: String,
        sync: bool,
    },
}

fuzz_target!(|input: Input| {
    let m = match input {
        Input::Raw(b) => {
            if let Ok(m) = decode(&b) {
                assert_eq!(encode(&m), b, "decoding is exact");
            }
            return;
        }
        Input::Request {
            id,
            op,
            set,
            entity,
            scope,
            expires_at,
        } => Message::Request(Request {
            id,
            op: [Op::Exists, Op::Explain, Op::Add, Op::Del][op as usize % 4],
            set,
            entity,
            scope,
            expires_at,
        }),
        Input::Answer { id, kind, n, text } => Message::Answer(
            id,
            match kind % 4 {
                0 => Answer::Int(n),
                1 => Answer::Explain(n, text),
                2 => Answer::Error(text),
                _ => Answer::Started,
            },
        ),
        Input::Rebuild { id, set, sync } => Message::Rebuild(Rebuild { id, set, sync }),
    };
    let b = encode(&m);
    match decode(&b) {
        Ok(d) => {
            if let (Message::Request(d), Message::Request(r)) = (&d, &m) {
                assert!(member::command::valid_set_name(d.set.as_bytes()));
                assert!(!d.entity.is_empty());
                assert!(d.expires_at.is_none_or(f64::is_finite));
                assert_eq!(
                    d.expires_at.map(f64::to_bits),
                    r.expires_at.map(f64::to_bits)
                );
                assert_eq!(
                    (d.id, d.op, &d.set, &d.entity, &d.scope),
                    (r.id, r.op, &r.set, &r.entity, &r.scope)
                );
            } else {
                assert_eq!(d, m);
            }
            assert_eq!(encode(&d), b);
        }
        Err(_) => {
            // Only what the receiver must refuse is refused.
            let refusable = match &m {
                Message::Request(r) => {
                    !member::command::valid_set_name(r.set.as_bytes())
                        || r.entity.is_empty()
                        || [&r.set, &r.entity, &r.scope]
                            .iter()
                            .any(|t| t.contains('\0'))
                        || r.expires_at.is_some_and(|x| !x.is_finite())
                }
                Message::Answer(_, Answer::Explain(_, t) | Answer::Error(t)) => t.contains('\0'),
                Message::Answer(_, Answer::Int(_) | Answer::Started) => false,
                Message::Rebuild(r) => {
                    !member::command::valid_set_name(r.set.as_bytes()) || r.set.contains('\0')
                }
            };
            assert!(refusable, "a valid message was refused: {m:?}");
        }
    }
});
