//! UTC budget windows: days, weeks starting Monday, calendar months.

use serde::{Deserialize, Serialize};

pub const DAY_MS: u64 = 86_400_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    Day,
    Week,
    Month,
}

impl Period {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "day" => Some(Self::Day),
            "week" => Some(Self::Week),
            "month" => Some(Self::Month),
            _ => None,
        }
    }
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day number.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn month_bounds(t_ms: u64) -> (u64, u64) {
    let (y, m, _) = civil_from_days((t_ms / DAY_MS) as i64);
    let start = days_from_civil(y, m, 1);
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    let end = days_from_civil(ny, nm, 1);
    (start as u64 * DAY_MS, end as u64 * DAY_MS)
}

/// `[start, end)` of the window holding `t_ms`.
pub fn window(period: Period, t_ms: u64) -> (u64, u64) {
    let day = t_ms / DAY_MS;
    match period {
        Period::Day => (day * DAY_MS, (day + 1) * DAY_MS),
        Period::Week => {
            // 1970-01-01 was a Thursday: Monday-based weekday = (day + 3) % 7.
            let monday = day - (day + 3) % 7;
            (monday * DAY_MS, (monday + 7) * DAY_MS)
        }
        Period::Month => month_bounds(t_ms),
    }
}

/// Length of the calendar month holding `t_ms`.
pub fn month_ms(t_ms: u64) -> u64 {
    let (s, e) = month_bounds(t_ms);
    e - s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(y: i64, m: u32, d: u32, h: u64) -> u64 {
        days_from_civil(y, m, d) as u64 * DAY_MS + h * 3_600_000
    }

    #[test]
    fn civil_round_trip() {
        for z in [-1000i64, 0, 59, 60, 10_956, 20_000, 20_512, 30_000] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2026, 11, 30), 20_787);
    }

    #[test]
    fn windows_are_utc_days_monday_weeks_and_calendar_months() {
        // 2026-11-30 is a Monday.
        let t = ms(2026, 11, 30, 15);
        assert_eq!(
            window(Period::Day, t),
            (ms(2026, 11, 30, 0), ms(2026, 12, 1, 0))
        );
        assert_eq!(
            window(Period::Week, t),
            (ms(2026, 11, 30, 0), ms(2026, 12, 7, 0))
        );
        // Sunday 2026-12-06 23:00 is still that week.
        assert_eq!(
            window(Period::Week, ms(2026, 12, 6, 23)).0,
            ms(2026, 11, 30, 0)
        );
        assert_eq!(
            window(Period::Month, t),
            (ms(2026, 11, 1, 0), ms(2026, 12, 1, 0))
        );
        // December rolls into the next year; February in a leap year has 29 days.
        assert_eq!(
            window(Period::Month, ms(2026, 12, 31, 23)).1,
            ms(2027, 1, 1, 0)
        );
        assert_eq!(month_ms(ms(2028, 2, 10, 0)), 29 * DAY_MS);
    }
}
