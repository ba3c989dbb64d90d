package events

import (
	"fmt"
	"math"
	"strconv"
)

// Numbers: a JSON number is read as its literal, then as an integer or a
// float whose range checks agree with JSON Schema's exact comparison.

// numberLit reads a JSON number and returns its text.
func (d *decoder) numberLit() ([]byte, *ValidationError) {
	start, i, n := d.pos, d.pos, len(d.data)
	fail := func(at int) ([]byte, *ValidationError) {
		d.pos = at
		return nil, d.unexpected("in numeric literal")
	}
	if i < n && d.data[i] == '-' {
		i++
	}
	switch {
	case i < n && d.data[i] == '0':
		i++
	case i < n && '1' <= d.data[i] && d.data[i] <= '9':
		for i++; i < n && isDigit(d.data[i]); i++ {
		}
	default:
		return fail(i)
	}
	if i < n && d.data[i] == '.' {
		i++
		if i >= n || !isDigit(d.data[i]) {
			return fail(i)
		}
		for i++; i < n && isDigit(d.data[i]); i++ {
		}
	}
	if i < n && (d.data[i] == 'e' || d.data[i] == 'E') {
		i++
		if i < n && (d.data[i] == '+' || d.data[i] == '-') {
			i++
		}
		if i >= n || !isDigit(d.data[i]) {
			return fail(i)
		}
		for i++; i < n && isDigit(d.data[i]); i++ {
		}
	}
	d.pos = i
	return d.data[start:i], nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func (d *decoder) numberStart(field, want string) *ValidationError {
	switch d.peek() {
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return nil
	}
	return d.wrongType(field, want)
}

// integer reads an integer member within [lo, hi] (hi <= MaxSafeInteger). Like
// JSON Schema, it takes any number whose value is an integer: 3, 3.0 and 3e0.
func (d *decoder) integer(field string, lo, hi int64) (int64, *ValidationError) {
	if err := d.numberStart(field, "an integer"); err != nil {
		return 0, err
	}
	lit, err := d.numberLit()
	if err != nil {
		return 0, err
	}
	v, isInt, fits := parseIntLit(lit)
	switch {
	case !isInt:
		return 0, d.invalid(field, reason("must be an integer, got "+quote(string(lit))))
	case !fits || v < lo || v > hi:
		return 0, d.invalid(field, reason(fmt.Sprintf("must be between %d and %d, got %s", lo, hi, quote(string(lit)))))
	}
	return v, nil
}

// parseIntLit returns the value of a JSON number literal when it is an integer
// (isInt) of at most 16 digits (fits); 10^16 > MaxSafeInteger.
func parseIntLit(lit []byte) (v int64, isInt, fits bool) {
	neg := lit[0] == '-'
	digits := lit
	if neg {
		digits = lit[1:]
	}
	if len(digits) <= 16 {
		plain := true
		for _, c := range digits {
			if !isDigit(c) {
				plain = false
				break
			}
			v = v*10 + int64(c-'0')
		}
		if plain {
			if neg {
				v = -v
			}
			return v, true, true
		}
	}
	dec := parseDecimal(lit)
	if dec.zero {
		return 0, true, true
	}
	if dec.exp < 0 {
		return 0, false, false
	}
	if len(dec.digits)+dec.exp > 16 {
		return 0, true, false
	}
	v = 0
	for _, c := range dec.digits {
		v = v*10 + int64(c-'0')
	}
	for range dec.exp {
		v *= 10
	}
	if dec.neg {
		v = -v
	}
	return v, true, true
}

// decimal is a JSON number literal as ±digits × 10^exp, digits without leading
// or trailing zeros.
type decimal struct {
	neg    bool
	zero   bool
	digits []byte
	exp    int
}

// parseDecimal analyses a literal that numberLit accepted.
func parseDecimal(lit []byte) decimal {
	var dec decimal
	i := 0
	if lit[0] == '-' {
		dec.neg = true
		i++
	}
	intStart := i
	for i < len(lit) && isDigit(lit[i]) {
		i++
	}
	intPart := lit[intStart:i]
	var frac []byte
	if i < len(lit) && lit[i] == '.' {
		i++
		fs := i
		for i < len(lit) && isDigit(lit[i]) {
			i++
		}
		frac = lit[fs:i]
	}
	exp := 0
	if i < len(lit) { // 'e' or 'E'
		i++
		eneg := false
		if lit[i] == '+' || lit[i] == '-' {
			eneg = lit[i] == '-'
			i++
		}
		for ; i < len(lit); i++ {
			if exp < 1e9 { // saturate: anything beyond is out of every range
				exp = exp*10 + int(lit[i]-'0')
			}
		}
		if eneg {
			exp = -exp
		}
	}
	all := make([]byte, 0, len(intPart)+len(frac))
	all = append(append(all, intPart...), frac...)
	exp -= len(frac)
	for len(all) > 0 && all[0] == '0' {
		all = all[1:]
	}
	if len(all) == 0 {
		dec.zero = true
		return dec
	}
	for all[len(all)-1] == '0' {
		all = all[:len(all)-1]
		exp++
	}
	dec.digits, dec.exp = all, exp
	return dec
}

// cmpPow10 compares a non-zero positive decimal with 10^k.
func (dec decimal) cmpPow10(k int) int {
	mag := len(dec.digits) - 1 + dec.exp // 10^mag <= value < 10^(mag+1)
	switch {
	case mag < k:
		return -1
	case mag > k:
		return 1
	case len(dec.digits) == 1 && dec.digits[0] == '1':
		return 0
	}
	return 1
}

// float reads a number member. Every float bound in the contracts is 0, 1 or 10
// and JSON Schema compares exactly, so when the nearest float64 is one of those
// values but the literal is not exactly it (1.0000000000000000001, 1e-400), the
// result is moved one ulp towards the literal: range checks on the float then
// agree with the schema.
func (d *decoder) float(field string) (float64, *ValidationError) {
	if err := d.numberStart(field, "a number"); err != nil {
		return 0, err
	}
	lit, err := d.numberLit()
	if err != nil {
		return 0, err
	}
	f, perr := strconv.ParseFloat(string(lit), 64)
	if perr != nil || math.IsInf(f, 0) {
		return 0, d.invalid(field, reason(quote(string(lit))+" is out of range of a 64-bit float"))
	}
	if f == 0 || f == 1 || f == 10 {
		if c := cmpExact(lit, f); c != 0 {
			f = math.Nextafter(f, math.Inf(c))
		}
	}
	return f, nil
}

// cmpExact compares the exact value of lit with f, which is 0, 1 or 10.
func cmpExact(lit []byte, f float64) int {
	if isSimple(lit) {
		return 0
	}
	dec := parseDecimal(lit)
	switch {
	case dec.zero && f == 0:
		return 0
	case dec.neg:
		return -1
	case dec.zero, f == 0:
		if dec.zero {
			return -1
		}
		return 1
	case f == 1:
		return dec.cmpPow10(0)
	default:
		return dec.cmpPow10(1)
	}
}

// isSimple reports whether lit is exact in float64 at a glance: an optional
// minus, at most 15 integer digits, and a fraction of zeros only.
func isSimple(lit []byte) bool {
	i := 0
	if lit[0] == '-' {
		i++
	}
	n := 0
	for i < len(lit) && isDigit(lit[i]) {
		i++
		n++
	}
	if n > 15 {
		return false
	}
	if i < len(lit) && lit[i] == '.' {
		for i++; i < len(lit) && lit[i] == '0'; i++ {
		}
	}
	return i == len(lit)
}
