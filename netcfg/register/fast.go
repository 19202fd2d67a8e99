package register

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/config"
)

// The fast path for the common register file: top-level "key: value"
// lines of the peer's fields, plain values, allowedIPs as a flow list, full
// line comments and blank lines; nothing YAML could read otherwise
// (quotes, anchors, block lists, indentation, a value YAML would take for
// null, a number where a string goes). fastYAMLPeer reads such a file
// without the YAML decoder and reports ok; anything else is not ok and
// goes to the full parser, which alone reports errors. A peer it reads is
// the one the full parser reads, lines included (TestFastPathMatches and
// FuzzFastPath compare the two).

// fastKeys are the fields the fast path reads.
var fastKeys = [...]string{"name", "description", "publicKey", "presharedKeyFile",
	"endpoint", "allowedIPs", "persistentKeepalive", "expires"}

// fastField is the field b names, as one of fastKeys' strings (a file's
// keys are not copied), and its index there; -1 if the fast path does not
// read it.
func fastField(b []byte) (string, int) {
	for i, k := range fastKeys {
		if string(b) == k {
			return k, i
		}
	}
	return "", -1
}

// fastYAMLPeer reads data as the fast path's subset of YAML.
func fastYAMLPeer(file string, data []byte) (peer config.WGPeer, line int, pf *config.PeerFile, ok bool) {
	// Printable ASCII and newlines only: YAML refuses control
	// characters anywhere, comments included, and the rest is the full
	// parser's to judge.
	for _, c := range data {
		if (c < 0x20 || c > 0x7e) && c != '\n' {
			return peer, 0, nil, false
		}
	}
	lines := config.Lines{}
	var seen uint
	n := 0
	for len(data) > 0 {
		n++
		var l []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			l, data = data[:i], data[i+1:]
		} else {
			l, data = data, nil
		}
		if len(l) == 0 || l[0] == '#' {
			continue
		}
		colon := bytes.Index(l, []byte(": "))
		if colon <= 0 {
			return peer, 0, nil, false
		}
		key, k := fastField(l[:colon])
		val := l[colon+2:]
		if k < 0 || seen&(1<<k) != 0 || len(val) == 0 {
			return peer, 0, nil, false
		}
		seen |= 1 << k
		if line == 0 {
			line = n
		}
		lines[key] = n
		switch key {
		case "allowedIPs":
			items, ok := flowList(val)
			if !ok {
				return peer, 0, nil, false
			}
			for i, it := range items {
				lines[config.IndexPath("allowedIPs", i)] = n
				peer.AllowedIPs = append(peer.AllowedIPs, it)
			}
			if len(items) == 0 {
				peer.AllowedIPs = []string{}
			}
		case "persistentKeepalive":
			v, err := strconv.Atoi(string(val))
			if err != nil || len(val) > 5 || (len(val) > 1 && val[0] == '0') || val[0] == '+' || val[0] == '-' {
				return peer, 0, nil, false
			}
			peer.PersistentKeepalive = v
		case "description":
			if !plainText(val) {
				return peer, 0, nil, false
			}
			peer.Description = string(val)
		default:
			if !plainToken(val) {
				return peer, 0, nil, false
			}
			s := string(val)
			switch key {
			case "name":
				peer.Name = s
			case "publicKey":
				peer.PublicKey = s
			case "presharedKeyFile":
				peer.PresharedKeyFile = s
			case "endpoint":
				peer.Endpoint = s
			case "expires":
				peer.Expires = s
			}
		}
	}
	if line == 0 {
		return peer, 0, nil, false // empty: the full parser says what it says
	}
	lines[""] = line
	return peer, line, &config.PeerFile{File: file, Lines: lines, Bad: map[string]bool{}, MaxErrs: MaxFileErrors}, true
}

// plainToken is a value the fast path takes as a string as YAML would: the
// characters of keys, addresses, host:port and paths, not starting with a
// YAML indicator, not one of YAML's null or boolean words, not a number.
func plainToken(v []byte) bool {
	for _, c := range v {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("+/=._:-", c) >= 0) {
			return false
		}
	}
	switch v[0] {
	case '-', ':', '.':
		// "-x" may be a list item, ":x" a key, ".5" a number.
		return false
	case '+':
		// "+5", "+0x1F", "+1_000" and "+.inf" are numbers to YAML, but
		// nothing YAML reads as other than a string holds a '=' or a '/':
		// so a key (base64, one in 64 of which begins with '+') is a
		// string.
		if !bytes.ContainsAny(v, "=/") {
			return false
		}
	}
	if v[len(v)-1] == ':' {
		return false
	}
	return !yamlSpecial(string(v))
}

// plainText is free text the fast path takes as YAML would: words of
// letters, digits and a few punctuation marks, single spaces.
func plainText(v []byte) bool {
	if v[0] == ' ' || v[len(v)-1] == ' ' || bytes.Contains(v, []byte("  ")) {
		return false
	}
	for _, c := range v {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(" ._()", c) >= 0) {
			return false
		}
	}
	if c := v[0]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
		return false
	}
	return !yamlSpecial(string(v))
}

// yamlWords are the words YAML reads as null or a boolean (YAML 1.1's
// too), or as infinity or not a number, in any case.
var yamlWords = [...]string{"null", "~", "true", "false", "yes", "no", "on", "off", "y", "n", ".inf", ".nan"}

// yamlSpecial reports whether YAML would read s as something other than
// a string: null, a boolean (YAML 1.1's words too), or a number.
func yamlSpecial(s string) bool {
	if len(s) <= 5 {
		for _, w := range yamlWords {
			if strings.EqualFold(s, w) {
				return true
			}
		}
	}
	// Only what can start a number goes to strconv (whose errors
	// allocate): a digit, a sign, a point, or inf/nan; never a prefix,
	// nor anything with a character no number holds.
	if s == "" || strings.ContainsAny(s, "/:=") {
		return false
	}
	if c := s[0]; !(c >= '0' && c <= '9' || strings.IndexByte("+-.iInN", c) >= 0) {
		return false
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return true
	}
	if _, err := strconv.ParseInt(s, 0, 64); err == nil {
		return true
	}
	return false
}

// flowList reads "[a, b]" (or "[a,b]", "[]") of prefix-shaped items.
func flowList(v []byte) ([]string, bool) {
	if len(v) < 2 || v[0] != '[' || v[len(v)-1] != ']' {
		return nil, false
	}
	inner := v[1 : len(v)-1]
	if len(inner) == 0 {
		return nil, true
	}
	out := make([]string, 0, bytes.Count(inner, []byte(","))+1)
	for rest := inner; rest != nil; {
		it := rest
		if i := bytes.IndexByte(rest, ','); i >= 0 {
			it, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		it = bytes.TrimPrefix(it, []byte(" "))
		if len(it) == 0 {
			return nil, false
		}
		for _, c := range it {
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == '.' || c == ':' || c == '/') {
				return nil, false
			}
		}
		if c := it[0]; c == ':' || c == '.' || c == '/' || yamlSpecial(string(it)) {
			return nil, false
		}
		out = append(out, string(it))
	}
	return out, true
}
