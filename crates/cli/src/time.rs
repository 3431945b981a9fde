//! The time `tandem events --timestamps` puts before each line, as `drbdsetup events2
//! --timestamps` does: local time, ISO 8601 with microseconds and the UTC offset
//! (`2026-11-27T04:00:00.123456+00:00`).

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in local time (UTC if the local time cannot be had).
pub fn now_iso8601() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as libc::time_t;
    // SAFETY: `tm` is plain data that localtime_r/gmtime_r fill in; both only read `secs`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let local = unsafe { !libc::localtime_r(&secs, &mut tm).is_null() };
    if !local {
        tm = unsafe { std::mem::zeroed() };
        // SAFETY: as above; gmtime_r sets tm_gmtoff to 0.
        unsafe { libc::gmtime_r(&secs, &mut tm) };
    }
    format(&tm, d.subsec_micros())
}

/// `tm` (a broken-down time with its offset from UTC) and the microseconds.
fn format(tm: &libc::tm, micros: u32) -> String {
    let off = tm.tm_gmtoff;
    let sign = if off < 0 { '-' } else { '+' };
    let off = off.unsigned_abs();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}{sign}{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        micros,
        off / 3600,
        off / 60 % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tm(gmtoff: libc::c_long) -> libc::tm {
        // SAFETY: plain data.
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        tm.tm_year = 126;
        tm.tm_mon = 10;
        tm.tm_mday = 27;
        tm.tm_hour = 4;
        tm.tm_min = 5;
        tm.tm_sec = 9;
        tm.tm_gmtoff = gmtoff;
        tm
    }

    #[test]
    fn like_events2_with_the_offset_of_the_zone() {
        assert_eq!(format(&tm(0), 123), "2026-11-27T04:05:09.000123+00:00");
        assert_eq!(
            format(&tm(3600), 999_999),
            "2026-11-27T04:05:09.999999+01:00"
        );
        // A half-hour zone west of UTC.
        assert_eq!(
            format(&tm(-(3 * 3600 + 1800)), 0),
            "2026-11-27T04:05:09.000000-03:30"
        );
    }

    #[test]
    fn now_has_the_shape() {
        let t = now_iso8601();
        assert_eq!(t.len(), "2026-11-27T04:05:09.000123+00:00".len(), "{t}");
        assert_eq!(&t[10..11], "T", "{t}");
        assert_eq!(&t[19..20], ".", "{t}");
    }
}
