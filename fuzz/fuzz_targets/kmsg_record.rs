//! Fuzzes the `/dev/kmsg` record parser and the saved-line parser.
//! Invariants: no panic; a record that parses round-trips its header fields
//! (PRI, SEQ, TS_USEC, continuation flag) through a re-rendered header; message
//! and dictionary are sub-slices of the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xid_parser::{parse_kmsg_record, parse_line};

fuzz_target!(|data: &[u8]| {
    if let Ok(rec) = parse_kmsg_record(data) {
        let pri = (u32::from(rec.facility) << 3) | u32::from(rec.level);
        let flags = if rec.continuation { "c" } else { "-" };
        let rendered = format!("{pri},{},{},{flags};", rec.seq, rec.ts_usec);
        let mut buf = rendered.into_bytes();
        buf.extend_from_slice(rec.message);
        let again = parse_kmsg_record(&buf).expect("re-rendered record parses");
        assert_eq!((again.facility, again.level), (rec.facility, rec.level));
        assert_eq!((again.seq, again.ts_usec), (rec.seq, rec.ts_usec));
        assert_eq!(again.continuation, rec.continuation);
        assert_eq!(again.message, rec.message);
        let range = data.as_ptr_range();
        assert!(range.contains(&rec.message.as_ptr()) || rec.message.is_empty());
        let _ = rec.message();
    }
    let line = parse_line(data);
    if let Some(l) = line.level {
        assert!(l < 8);
    }
});
