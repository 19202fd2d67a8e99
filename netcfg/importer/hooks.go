package importer

import (
	"path/filepath"
	"regexp"
	"strings"
)

// hookResult is what one wg-quick hook line means to nodeagent.
type hookResult struct {
	masq    []masquerade
	forward []forward
	sysctls [][2]string
	// other are the commands of the line nothing here understood.
	other []string
}

type masquerade struct{ from, out string }
type forward struct{ in, out string }

// parseHook reads a hook command line (with %i already replaced): each of
// its commands (split at ; && ||) is an iptables/ip6tables or nft
// masquerade or forward accept, a sysctl write, or other.
func parseHook(line string) hookResult {
	var r hookResult
	line = strings.NewReplacer("&&", ";", "||", ";").Replace(line)
	for cmd := range strings.SplitSeq(line, ";") {
		cmd = strings.TrimSpace(cmd)
		if cmd == "" {
			continue
		}
		f := strings.Fields(strings.NewReplacer("'", "", "\"", "").Replace(cmd))
		if !parseCommand(f, &r) {
			r.other = append(r.other, cmd)
		}
	}
	return r
}

// parseCommand adds what the command f means to r, or reports false.
func parseCommand(f []string, r *hookResult) bool {
	if len(f) == 0 {
		return false
	}
	prog := filepath.Base(f[0])
	switch {
	case strings.HasPrefix(prog, "iptables") || strings.HasPrefix(prog, "ip6tables"):
		return parseIPTables(f[1:], r)
	case prog == "nft":
		return parseNft(f[1:], r)
	case prog == "sysctl":
		return parseSysctl(f[1:], r)
	case prog == "echo" && len(f) == 4 && f[2] == ">" && strings.HasPrefix(f[3], "/proc/sys/net/"):
		// The path's '/' separate segments; a '.' in one (a link's name)
		// is written '/' in the config's key.
		segs := strings.Split(strings.TrimPrefix(f[3], "/proc/sys/"), "/")
		for i := range segs {
			segs[i] = strings.ReplaceAll(segs[i], ".", "/")
		}
		key := strings.Join(segs, ".")
		if !sysctlKeyRE.MatchString(key) {
			return false
		}
		r.sysctls = append(r.sysctls, [2]string{key, f[1]})
		return true
	}
	return false
}

// parseIPTables understands "-t nat -A POSTROUTING -s X -o Y -j
// MASQUERADE" and "-A FORWARD -i A -o B -j ACCEPT", flags in any order,
// -A or -I (with an optional position); a -D of either is understood too
// (the PostDown undoing a PostUp) and adds nothing. Any other match makes
// the rule one nodeagent's stanzas do not express.
func parseIPTables(f []string, r *hookResult) bool {
	var table, chain, op, src, in, out, target string
	table = "filter"
	for i := 0; i < len(f); i++ {
		arg := func() string {
			if i+1 < len(f) {
				i++
				return f[i]
			}
			return ""
		}
		switch f[i] {
		case "-t", "--table":
			table = arg()
		case "-A", "--append", "-I", "--insert", "-D", "--delete":
			op = strings.TrimLeft(f[i], "-")[:1]
			if op == "a" || op == "i" || op == "d" {
				op = strings.ToUpper(op)
			}
			chain = arg()
			if op != "D" && i+1 < len(f) && isDigits(f[i+1]) {
				i++
			}
		case "-s", "--source", "--src":
			src = arg()
		case "-i", "--in-interface":
			in = arg()
		case "-o", "--out-interface":
			out = arg()
		case "-j", "--jump":
			target = arg()
		case "-w", "--wait":
			if i+1 < len(f) && isDigits(f[i+1]) {
				i++
			}
		default:
			return false
		}
	}
	switch {
	case table == "nat" && chain == "POSTROUTING" && target == "MASQUERADE" && src != "" && out != "" && in == "":
		if op != "D" {
			r.masq = append(r.masq, masquerade{from: src, out: out})
		}
		return op != ""
	case table == "filter" && chain == "FORWARD" && target == "ACCEPT" && in != "" && out != "" && src == "":
		if op != "D" {
			r.forward = append(r.forward, forward{in: in, out: out})
		}
		return op != ""
	}
	return false
}

// parseNft understands "add|insert rule FAMILY TABLE postrouting ip saddr
// X oifname Y masquerade" and "... forward iifname A oifname B accept";
// "delete" lines are understood and add nothing.
func parseNft(f []string, r *hookResult) bool {
	if len(f) < 1 {
		return false
	}
	switch f[0] {
	case "delete", "flush":
		return len(f) > 1 && (f[1] == "rule" || f[1] == "table" || f[1] == "chain")
	case "add", "insert":
	default:
		return false
	}
	if len(f) < 5 || f[1] != "rule" {
		return false
	}
	chain := f[4]
	var src, in, out, verdict string
	for i := 5; i < len(f); i++ {
		switch f[i] {
		case "ip", "ip6":
		case "saddr":
			if i+1 < len(f) {
				i++
				src = f[i]
			}
		case "iifname", "iif":
			if i+1 < len(f) {
				i++
				in = f[i]
			}
		case "oifname", "oif":
			if i+1 < len(f) {
				i++
				out = f[i]
			}
		case "masquerade", "accept":
			verdict = f[i]
		case "counter":
		default:
			return false
		}
	}
	switch {
	case chain == "postrouting" && verdict == "masquerade" && src != "" && out != "" && in == "":
		r.masq = append(r.masq, masquerade{from: src, out: out})
		return true
	case chain == "forward" && verdict == "accept" && in != "" && out != "" && src == "":
		r.forward = append(r.forward, forward{in: in, out: out})
		return true
	}
	return false
}

// parseSysctl understands "sysctl [-q] [-w] KEY=VALUE...".
func parseSysctl(f []string, r *hookResult) bool {
	var kv [][2]string
	for _, a := range f {
		switch a {
		case "-w", "-q", "--write", "--quiet":
			continue
		}
		k, v, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(k, "net.") && !strings.HasPrefix(k, "net/") {
			return false
		}
		if strings.Contains(k, "/") {
			// The slash form: '/' separates, '.' is inside a segment.
			k = strings.ReplaceAll(strings.ReplaceAll(k, ".", "\x00"), "/", ".")
			k = strings.ReplaceAll(k, "\x00", "/")
		}
		if !sysctlKeyRE.MatchString(k) || strings.TrimSpace(v) == "" {
			return false
		}
		kv = append(kv, [2]string{k, v})
	}
	if len(kv) == 0 {
		return false
	}
	r.sysctls = append(r.sysctls, kv...)
	return true
}

// sysctlKeyRE is a key the config takes (config's checkSysctlKey).
var sysctlKeyRE = regexp.MustCompile(`^net(\.[A-Za-z0-9_*/-]+)+$`)

func isDigits(s string) bool { return s != "" && strings.Trim(s, "0123456789") == "" }

// keyRE is anything shaped like a WireGuard key (43 base64 characters
// and the padding, 32 bytes), wherever it stands: as a word, after
// KEY=, before a | or a >.
var keyRE = regexp.MustCompile(`[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=`)

// redact replaces everything of s shaped like a WireGuard key with
// "(key)", so that a line shown in a comment never carries one.
func redact(s string) string {
	return keyRE.ReplaceAllString(s, "(key)")
}

// NotesName is the notes file in the output directory: 0600, root's only,
// for what the 0644 config must not hold (hook lines, which may carry a
// token or a password).
const NotesName = "import-notes.txt"

// commandKind names what a hook command runs without quoting it: its
// program, when that is a plain word (after any VAR=value assignments),
// and what it is for where that is known. Nothing of its arguments, which
// may be secrets.
func commandKind(cmd string) string {
	f := strings.Fields(strings.NewReplacer("'", " ", "\"", " ").Replace(cmd))
	for len(f) > 0 && strings.Contains(f[0], "=") {
		f = f[1:]
	}
	if len(f) == 0 {
		return "a command, which nodeagent does not run"
	}
	prog := filepath.Base(f[0])
	if !progRE.MatchString(prog) {
		return "a command, which nodeagent does not run"
	}
	switch {
	case strings.HasPrefix(prog, "iptables") || strings.HasPrefix(prog, "ip6tables"):
		return "an " + prog + " rule nodeagent cannot translate, and does not run"
	case prog == "nft":
		return "an nft command nodeagent cannot translate, and does not run"
	}
	return "a " + prog + " command, which nodeagent does not run"
}

var progRE = regexp.MustCompile(`^[a-z][a-z0-9_.+-]{0,31}$`)
