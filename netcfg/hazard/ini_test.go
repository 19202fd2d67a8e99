package hazard

import (
	"slices"
	"testing"
)

// The pieces of systemd's parsing the reader reproduces, case by case.
func TestExtractWords(t *testing.T) {
	for _, c := range []struct {
		in   string
		mode int
		want []string
		bad  bool
	}{
		{"en* wg0", wordsPlain, []string{"en*", "wg0"}, false},
		{`"a b" c`, wordsPlain, []string{`"a`, `b"`, "c"}, false},
		{`"a b" c`, wordsMatch, []string{"a b", "c"}, false},
		{`a\ b`, wordsPlain, []string{"a b"}, false},
		{`a\*b`, wordsMatch, []string{`a\*b`}, false},
		{`"unbalanced`, wordsMatch, nil, true},
		{`x trailing\`, wordsPlain, []string{"x"}, true},
		{`"ID_X=a\x41" B=c`, wordsProperty, []string{"ID_X=aA", "B=c"}, false},
		{`A=\q`, wordsProperty, nil, true},
	} {
		got, bad := extractWords(c.in, c.mode)
		if !slices.Equal(got, c.want) || bad != c.bad {
			t.Errorf("%q mode %d: %q %v, want %q %v", c.in, c.mode, got, bad, c.want, c.bad)
		}
	}
}

func TestFnmatch(t *testing.T) {
	for _, c := range []struct {
		p, s string
		fold bool
		want bool
	}{
		{"en*", "enp7s0.50", false, true},
		{"en?", "enp7s0", false, false},
		{"[!e]*", "wg0", false, true},
		{"[^e]*", "enp7s0", false, false},
		{"[[:digit:]]*", "0x", false, true},
		{"*.50", "enp7s0.50", false, true},
		{"a/b*", "a/bc", false, true},
		{"[", "[", false, true},
		{`\*`, "*", false, true},
		{"NODE*", "node1", true, true},
		{"802.1Q*", "802.1Q VLAN Support", false, true},
	} {
		if got := fnmatch(c.p, c.s, c.fold); got != c.want {
			t.Errorf("fnmatch(%q, %q) = %v", c.p, c.s, got)
		}
	}
}

func TestParseHWAddr(t *testing.T) {
	for in, want := range map[string]int{
		"52:54:00:12:34:56": 6, "52-54-00-12-34-56": 6, "5254.0012.3456": 6, "2:0:0:0:0:1": 6,
		"00:00:00:00:00:00": 6, "10.0.0.1": 4, "!52:54:00:12:34:56": 0, "52:54:00:12:34": 0, "xyz": 0,
	} {
		h, ok := parseHWAddr(in)
		if (want == 0) == ok || len(h) != want {
			t.Errorf("%q: %v %v, want %d bytes", in, h, ok, want)
		}
	}
}

// A section header without its bracket, or a line that is not UTF-8,
// refuses the whole file; a continued line joins the next.
func TestParseINI(t *testing.T) {
	if _, err := parseINI([]byte("[Match\nName=*\n")); err == nil {
		t.Error("a bad header was taken")
	}
	if _, err := parseINI([]byte("[Match]\nName=\xff\n")); err == nil {
		t.Error("a line that is not UTF-8 was taken")
	}
	as, err := parseINI([]byte("Outside=1\n[Match]\nName=a \\\n# a comment inside\n  b\n; another\n[Link]\nUnmanaged = yes\n"))
	if err != nil || len(as) != 2 || as[0].value != "a    b" || as[1].key != "Unmanaged" || as[1].value != "yes" {
		t.Errorf("%+v %v", as, err)
	}
}
