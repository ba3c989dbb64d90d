package redisx

import (
	"strings"
	"testing"
)

func TestEscape(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"plain id untouched", "bot_abc123", "bot_abc123"},
		{"colon", "a:b", "a%3Ab"},
		{"hash tag braces", "x}y{z", "x%7Dy%7Bz"},
		{"percent itself", "100%", "100%25"},
		{"ipv6 literal", "2001:db8::1", "2001%3Adb8%3A%3A1"},
		{"control and space", "a b\n", "a%20b%0A"},
		{"utf-8 kept", "usér", "usér"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Escape(tc.in)
			if got != tc.want {
				t.Fatalf("Escape(%q) = %q, want %q", tc.in, got, tc.want)
			}
			back, ok := Unescape(got)
			if !ok || back != tc.in {
				t.Fatalf("Unescape(%q) = %q, %v; want %q", got, back, ok, tc.in)
			}
		})
	}
}

func TestKeysShareOneHashTag(t *testing.T) {
	// An id crafted to close the hash tag early must not move the key to another slot.
	for _, id := range []string{"plain", "evil}{other", "a:b:c", "{x}"} {
		b, p := BucketKey("bot", id, "principal"), PenaltyKey("bot", id)
		tb, tp := hashTag(b), hashTag(p)
		if tb != tp || tb != PrincipalTag("bot", id)[1:len(PrincipalTag("bot", id))-1] {
			t.Fatalf("id %q: tags %q and %q differ or are not the principal tag", id, tb, tp)
		}
	}
	if BucketKey("bot", "a:b", "x") == BucketKey("bot:a", "b", "x") {
		t.Fatal("kind and id boundary is ambiguous")
	}
}

// TestPrincipalKeysOneAllocation: a principal's keys are the "fg:" prefix,
// its PrincipalTag and the suffix, built in one allocation when nothing
// needs escaping (the limiter builds one a check).
func TestPrincipalKeysOneAllocation(t *testing.T) {
	tag := PrincipalTag("bot", "bot_abc123")
	for _, c := range []struct {
		name, got, want string
		build           func() string
	}{
		{"bucket", BucketKey("bot", "bot_abc123", "principal"), "fg:" + tag + ":tb:principal", func() string { return BucketKey("bot", "bot_abc123", "principal") }},
		{"penalty", PenaltyKey("bot", "bot_abc123"), "fg:" + tag + ":pen", func() string { return PenaltyKey("bot", "bot_abc123") }},
		{"day usage", DayUsageKey("bot", "bot_abc123", "2026-11-29"), "fg:" + tag + ":day:2026-11-29", func() string { return DayUsageKey("bot", "bot_abc123", "2026-11-29") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.got != c.want {
				t.Fatalf("got %q, want %q", c.got, c.want)
			}
			if n := testing.AllocsPerRun(100, func() { _ = c.build() }); n != 1 {
				t.Fatalf("%v allocations, want 1", n)
			}
		})
	}
}

// hashTag mirrors Redis Cluster: the bytes between the first '{' and the next '}'.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}

func FuzzEscape(f *testing.F) {
	for _, s := range []string{"", "bot_1", "a:b", "}{", "%zz", "2001:db8::1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := Escape(s)
		if strings.ContainsAny(e, ":{} ") {
			t.Fatalf("Escape(%q) = %q keeps a structural byte", s, e)
		}
		back, ok := Unescape(e)
		if !ok || back != s {
			t.Fatalf("round trip of %q: %q, %v", s, back, ok)
		}
	})
}

func BenchmarkBucketKey(b *testing.B) {
	for b.Loop() {
		_ = BucketKey("bot", "bot_abc123", "principal")
	}
}
