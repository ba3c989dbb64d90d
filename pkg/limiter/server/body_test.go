package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
)

// decodeBodyAsBefore is what decodeBody replaced: its result and error are
// the contract (the problem's detail quotes the error).
func decodeBodyAsBefore(body io.Reader, limit int64, v any) error {
	return json.NewDecoder(io.LimitReader(body, limit)).Decode(v)
}

// failingAfter yields body, then fails with err.
func failingAfter(body string, err error) io.Reader {
	return io.MultiReader(strings.NewReader(body), errReader{err})
}

// oneByteReader yields one byte a read, as a slow client's body does.
type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) { return o.r.Read(p[:min(len(p), 1)]) }

// requireDecodesAsBefore decodes body (made twice by mk) both ways.
func requireDecodesAsBefore(t *testing.T, mk func() io.Reader, limit int64) {
	t.Helper()
	var want, got checkapi.CheckRequest
	wantErr := decodeBodyAsBefore(mk(), limit, &want)
	gotErr := decodeBody(mk(), limit, &got)
	require.Equal(t, fmt.Sprint(wantErr), fmt.Sprint(gotErr))
	if wantErr == nil {
		require.Equal(t, want, got)
	}
}

// TestDecodeBodyAsBefore: the same value and the same error as a Decoder
// over a LimitReader, for every kind of body: well formed, padded, with
// more after the value, empty, truncated, of the wrong types, over the
// limit, failing to read, and read a byte at a time.
func TestDecodeBodyAsBefore(t *testing.T) {
	check := `{"principal":{"kind":"user","id":"u00042"},"ip":"203.0.113.7","method":"GET","route":"/v1/items","cost":2}`
	long := `{"principal":{"kind":"user","id":"u1"},"route":"` + strings.Repeat("r", 900) + `"}`
	broken := errors.New("connection reset")
	for _, tc := range []struct {
		name  string
		body  func() io.Reader
		limit int64
	}{
		{"check", func() io.Reader { return strings.NewReader(check) }, maxCheckBody},
		{"padded", func() io.Reader { return strings.NewReader(" \n\t" + check + "\r\n ") }, maxCheckBody},
		{"value then junk", func() io.Reader { return strings.NewReader(check + "junk") }, maxCheckBody},
		{"two values", func() io.Reader { return strings.NewReader(check + check) }, maxCheckBody},
		{"empty", func() io.Reader { return strings.NewReader("") }, maxCheckBody},
		{"blank", func() io.Reader { return strings.NewReader("  ") }, maxCheckBody},
		{"truncated", func() io.Reader { return strings.NewReader(check[:40]) }, maxCheckBody},
		{"not an object", func() io.Reader { return strings.NewReader(`[1,2]`) }, maxCheckBody},
		{"a number", func() io.Reader { return strings.NewReader(`123`) }, maxCheckBody},
		{"wrong type", func() io.Reader { return strings.NewReader(`{"cost":"two","route":"/x"}`) }, maxCheckBody},
		{"wrong type late", func() io.Reader { return strings.NewReader(`{"route":"/x","principal":{"kind":7}}`) }, maxCheckBody},
		{"unknown fields", func() io.Reader { return strings.NewReader(`{"route":"/x","extra":{"a":[1]}}`) }, maxCheckBody},
		{"bad syntax", func() io.Reader { return strings.NewReader(`{"route":"/x",}`) }, maxCheckBody},
		{"invalid utf-8", func() io.Reader { return strings.NewReader("{\"route\":\"\xff\"}") }, maxCheckBody},
		{"value within the limit, more after it", func() io.Reader { return strings.NewReader(check + strings.Repeat(" ", 200) + "x") }, int64(len(check) + 10)},
		{"value cut by the limit", func() io.Reader { return strings.NewReader(long) }, 500},
		{"value exactly the limit", func() io.Reader { return strings.NewReader(check) }, int64(len(check))},
		{"larger than the pooled buffer", func() io.Reader { return strings.NewReader(long + long) }, maxCheckBody},
		{"read error before the value ends", func() io.Reader { return failingAfter(check[:50], broken) }, maxCheckBody},
		{"read error after the value", func() io.Reader { return failingAfter(check, broken) }, maxCheckBody},
		{"read error after a number", func() io.Reader { return failingAfter(`42`, broken) }, maxCheckBody},
		{"a byte at a time", func() io.Reader { return oneByteReader{strings.NewReader(check)} }, maxCheckBody},
	} {
		t.Run(tc.name, func(t *testing.T) { requireDecodesAsBefore(t, tc.body, tc.limit) })
	}
}

// FuzzDecodeBody: any body, any limit, decodes as before.
func FuzzDecodeBody(f *testing.F) {
	f.Add([]byte(`{"principal":{"kind":"user","id":"u1"},"ip":"203.0.113.7","method":"GET","route":"/v1/items"}`), uint16(8192))
	f.Add([]byte(`{"cost":"x"} {}`), uint16(5))
	f.Add([]byte(`{"principal":{"kind":"bot","id":"b"},"cost":-25,"plan":"pro","priority":"critical","resource":"r"}`), uint16(8192))
	f.Add([]byte(``), uint16(0))
	f.Fuzz(func(t *testing.T, body []byte, limit uint16) {
		requireDecodesAsBefore(t, func() io.Reader { return strings.NewReader(string(body)) }, int64(limit))
	})
}

// TestDecodeCheckAsJSON: the plain form decodeCheck takes decodes as json
// does, and every body outside it is left to json (false, req untouched);
// either way decodeBody answers as before.
func TestDecodeCheckAsJSON(t *testing.T) {
	all := `{"principal":{"kind":"bot","id":"b-7"},"ip":"2001:db8::1","method":"POST","route":"/channels/{channel_id}/messages","resource":"r1","cost":25,"plan":"pro","priority":"critical"}`
	for _, tc := range []struct {
		body  string
		plain bool
	}{
		{all, true},
		{`{"principal":{"kind":"user","id":"u00042"},"ip":"203.0.113.7","method":"GET","route":"/v1/items"}`, true},
		{" {\n\t\"route\" : \"/x\" ,\r\n \"principal\":{ \"id\":\"a\", \"kind\":\"user\" } } \n", true},
		{`{"cost":-3}`, true},
		{`{"cost":0}`, true},
		{`{"cost":-0}`, true},
		{`{"cost":123456789012345678}`, true},
		{`{"cost":1234567890123456789}`, false},
		{`{"cost":99999999999999999999}`, false},
		{`{"cost":1.0}`, false},
		{`{"cost":1e2}`, false},
		{`{"cost":01}`, false},
		{`{"cost":-}`, false},
		{`{"cost":"1"}`, false},
		{`{"cost":null}`, false},
		{`{"route":null}`, false},
		{`{}`, false},
		{`{"route":"/a","route":"/b"}`, false},
		{`{"principal":{"kind":"user"},"principal":{"id":"x"}}`, false},
		{`{"Route":"/a"}`, false},
		{`{"ROUTE":"/a"}`, false},
		{`{"principal":{"Kind":"user","ID":"x"}}`, false},
		{`{"route":"/a\/b"}`, false},
		{`{"route":"/a\u0041"}`, false},
		{`{"route":"/é"}`, false},
		{"{\"route\":\"/a\x7f\"}", false},
		{"{\"route\":\"/a\tb\"}", false},
		{`{"extra":1,"route":"/a"}`, false},
		{`{"route":"/a","principal":{"kind":"user","id":"x","extra":true}}`, false},
		{`{"route":"/a",}`, false},
		{`{"route":"/a"} {}`, false},
		{`{"route":"/a"}x`, false},
		{`{"route":"/a"`, false},
		{`{"route" "/a"}`, false},
		{`{"principal":[]}`, false},
		{`[]`, false},
		{``, false},
	} {
		t.Run(tc.body, func(t *testing.T) {
			var req checkapi.CheckRequest
			require.Equal(t, tc.plain, decodeCheck([]byte(tc.body), &req))
			if tc.plain {
				var want checkapi.CheckRequest
				require.NoError(t, json.Unmarshal([]byte(tc.body), &want))
				require.Equal(t, want, req)
			} else {
				require.Equal(t, checkapi.CheckRequest{}, req, "left untouched")
			}
			requireDecodesAsBefore(t, func() io.Reader { return strings.NewReader(tc.body) }, maxCheckBody)
		})
	}
}
