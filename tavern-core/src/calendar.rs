//! Calendar arithmetic for dates written as words (`May 8 2023`): what memories and chat
//! messages are indexed with, and how the command line prints a day. Pure, proleptic Gregorian,
//! UTC.

/// English month names, January first.
pub const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Days since 1970-01-01 of a proleptic Gregorian date (`month` 1..=12): the inverse of
/// [`civil_from_days`].
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let (m, d) = (i64::from(month), i64::from(day));
    let y = if m <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `(year, month 1..=12, day)` of days since 1970-01-01 (proleptic Gregorian).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// The UTC day of epoch milliseconds as words, `May 8 2023`: what texts are indexed with so a
/// query naming a month or a year finds what was said or written then.
pub fn day_words(ms: i64) -> String {
    let (year, month, day) = civil_from_days(ms.div_euclid(86_400_000));
    let name = MONTHS[(month as usize).saturating_sub(1) % 12];
    format!("{name} {day} {year}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_become_gregorian_dates_across_leap_days_and_before_1970() {
        for (days, date) in [
            (0, (1970, 1, 1)),
            (11_016, (2000, 2, 29)),
            (19_485, (2023, 5, 8)),
            (-1, (1969, 12, 31)),
            (47_541, (2100, 3, 1)),
        ] {
            assert_eq!(civil_from_days(days), date, "{days}");
            assert_eq!(days_from_civil(date.0, date.1, date.2), days, "{date:?}");
        }
        assert_eq!(day_words(19_485 * 86_400_000 + 1), "May 8 2023");
        assert_eq!(day_words(-1), "December 31 1969");
    }
}
