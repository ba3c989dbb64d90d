package events

import (
	"fmt"
	"time"
)

// TimeLayout is the one timestamp format of the contracts: RFC 3339 in UTC with
// exactly three fractional digits, e.g. "2026-11-22T10:00:00.123Z". Format only
// UTC times with it (FormatTime converts).
const TimeLayout = "2006-01-02T15:04:05.000Z"

// Timestamps must lie within these years; an earlier time (including the zero
// time.Time) is a bug in the producer.
const (
	minYear = 1970
	maxYear = 9999
)

// FormatTime formats t as TimeLayout after converting it to UTC; sub-millisecond
// digits are truncated.
func FormatTime(t time.Time) string { return string(AppendTime(make([]byte, 0, len(TimeLayout)), t)) }

// AppendTime appends FormatTime(t) to b.
func AppendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > maxYear {
		return t.AppendFormat(b, TimeLayout)
	}
	hour, minute, sec := t.Clock()
	ms := t.Nanosecond() / int(time.Millisecond)
	return append(b,
		byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+month/10), byte('0'+month%10), '-',
		byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':',
		byte('0'+minute/10), byte('0'+minute%10), ':',
		byte('0'+sec/10), byte('0'+sec%10), '.',
		byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10), 'Z')
}

// ParseTime parses a timestamp in TimeLayout, strictly: upper-case T and Z, three
// fractional digits, a real calendar date, no leap second, years 1970–9999.
func ParseTime(s string) (time.Time, error) {
	t, err := parseTime(s)
	return t, asError(err)
}

func parseTime[S ~string | ~[]byte](s S) (time.Time, *ValidationError) {
	bad := func() (time.Time, *ValidationError) {
		return time.Time{}, reason(fmt.Sprintf("%s is not a UTC timestamp with millisecond precision like 2026-11-22T10:00:00.123Z", quote(string(s))))
	}
	if len(s) != len(TimeLayout) || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' ||
		s[16] != ':' || s[19] != '.' || s[23] != 'Z' {
		return bad()
	}
	year, ok1 := digits(s, 0, 4)
	month, ok2 := digits(s, 5, 2)
	day, ok3 := digits(s, 8, 2)
	hour, ok4 := digits(s, 11, 2)
	minute, ok5 := digits(s, 14, 2)
	sec, ok6 := digits(s, 17, 2)
	ms, ok7 := digits(s, 20, 3)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7) || hour > 23 || minute > 59 || sec > 59 {
		return bad()
	}
	if month < 1 || month > 12 || day < 1 || day > daysIn(month, year) {
		return time.Time{}, reason(fmt.Sprintf("%s is not a valid date", quote(string(s))))
	}
	if year < minYear {
		return time.Time{}, reason(fmt.Sprintf("%s is before %d", quote(string(s)), minYear))
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, ms*int(time.Millisecond), time.UTC), nil
}

func digits[S ~string | ~[]byte](s S, from, n int) (int, bool) {
	v := 0
	for i := from; i < from+n; i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// validTime checks a timestamp about to be encoded.
func validTime(t time.Time) *ValidationError {
	if t.IsZero() {
		return reason("is required")
	}
	if y := t.UTC().Year(); y < minYear || y > maxYear {
		return reason(fmt.Sprintf("must be between %d and %d, got %s", minYear, maxYear, t.UTC().Format(time.RFC3339Nano)))
	}
	return nil
}
