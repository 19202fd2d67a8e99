package hazard

import (
	"bytes"
	"errors"
	"strings"
	"unicode/utf8"
)

// assignment is one Key=Value line of a systemd configuration file, in the
// section it stands in.
type assignment struct {
	section, key, value string
	line                int
	// file is the file it is read from (the main file or a drop-in).
	file string
}

// errBadFile is a file systemd refuses whole: a section header that is not
// one, a line that is not UTF-8, a line over systemd's LONG_LINE_MAX.
var errBadFile = errors.New("systemd would refuse the whole file")

// longLineMax is systemd's LONG_LINE_MAX.
const longLineMax = 1 << 20

// parseINI reads a file as systemd's config_parse() does (shared/
// conf-parser.c, the same in 252 and 257): lines end at \n, \r, \r\n or
// NUL; a line whose first non-blank character is # or ; is a comment, even
// inside a continuation; a line ending in an unescaped backslash continues
// on the next (the backslash becomes a space); a UTF-8 byte-order mark
// first is skipped. A section header must end with ']' and hold no quote,
// backslash or control character, and a line must be UTF-8, or the whole
// file is refused (errBadFile), as config_parse() fails and the .network
// or .link is not loaded. A line outside any section, or without '=', is
// ignored. Keys and values are trimmed of whitespace.
func parseINI(b []byte) ([]assignment, error) {
	var out []assignment
	section := ""
	inSection := false
	var cont *string
	lineNo := 0
	bomSeen := false
	for _, raw := range splitLines(b) {
		lineNo++
		if len(raw) > longLineMax {
			return nil, errBadFile
		}
		l := strings.TrimLeft(raw, whitespace)
		if l != "" && strings.ContainsRune("#;", rune(l[0])) {
			continue
		}
		l = raw
		if !bomSeen {
			if rest, ok := strings.CutPrefix(l, "\ufeff"); ok {
				l, bomSeen = rest, true
			}
		}
		var p string
		if cont != nil {
			if len(*cont)+len(l) > longLineMax {
				return nil, errBadFile
			}
			p = *cont + l
		} else {
			p = l
		}
		escaped := false
		for i := 0; i < len(p); i++ {
			if escaped {
				escaped = false
			} else if p[i] == '\\' {
				escaped = true
			}
		}
		if escaped {
			p = p[:len(p)-1] + " "
			cont = &p
			continue
		}
		cont = nil
		a, err := parseLine(p, lineNo, &section, &inSection)
		if err != nil {
			return nil, err
		}
		if a != nil {
			out = append(out, *a)
		}
	}
	if cont != nil {
		lineNo++
		a, err := parseLine(*cont, lineNo, &section, &inSection)
		if err != nil {
			return nil, err
		}
		if a != nil {
			out = append(out, *a)
		}
	}
	return out, nil
}

// whitespace is systemd's WHITESPACE.
const whitespace = " \t\n\r"

func parseLine(l string, n int, section *string, inSection *bool) (*assignment, error) {
	l = strings.Trim(l, whitespace)
	if l == "" {
		return nil, nil
	}
	if !utf8.ValidString(l) {
		return nil, errBadFile
	}
	if l[0] == '[' {
		if l[len(l)-1] != ']' || len(l) < 2 {
			return nil, errBadFile
		}
		name := l[1 : len(l)-1]
		if !stringIsSafe(name) {
			return nil, errBadFile
		}
		*section, *inSection = name, true
		return nil, nil
	}
	if !*inSection {
		return nil, nil
	}
	k, v, ok := strings.Cut(l, "=")
	if !ok || k == "" {
		return nil, nil
	}
	return &assignment{section: *section, key: strings.Trim(k, whitespace), value: strings.Trim(v, whitespace), line: n}, nil
}

// stringIsSafe is systemd's string_is_safe(): no control character, no
// quote, no backslash, no DEL.
func stringIsSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c > 0 && c < ' ') || strings.IndexByte("\"'\\\x7f", c) >= 0 {
			return false
		}
	}
	return true
}

// splitLines splits as systemd's read_line() does: \n, \r, \r\n and NUL
// each end a line; a last line without an end counts.
func splitLines(b []byte) []string {
	var out []string
	for len(b) > 0 {
		i := bytes.IndexAny(b, "\n\r\x00")
		if i < 0 {
			out = append(out, string(b))
			break
		}
		out = append(out, string(b[:i]))
		if b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n' {
			i++
		}
		b = b[i+1:]
	}
	return out
}

// word-splitting modes of systemd's extract_first_word(), as the [Match]
// parsers call it.
const (
	// wordsPlain (flags 0: Name=, OriginalName=, MACAddress=): quotes are
	// ordinary characters, a backslash escapes the next character.
	wordsPlain = iota
	// wordsMatch (EXTRACT_UNQUOTE|EXTRACT_RETAIN_ESCAPE: Type=, Kind=,
	// Driver=, Path=): quotes group and are removed, a backslash is kept.
	wordsMatch
	// wordsProperty (EXTRACT_CUNESCAPE|EXTRACT_UNQUOTE: Property=): quotes
	// group and are removed, C escapes are decoded.
	wordsProperty
)

// extractWords splits a value into words as extract_first_word() does in
// a loop, and whether the loop stopped at a syntax error (an unbalanced
// quote, a trailing backslash, a bad escape): the words before it are
// kept, the rest of the value is ignored, as the parsers do.
func extractWords(s string, mode int) (words []string, bad bool) {
	unquote := mode != wordsPlain
	retainEscape := mode == wordsMatch
	i := 0
	for {
		for i < len(s) && strings.IndexByte(whitespace, s[i]) >= 0 {
			i++
		}
		if i >= len(s) {
			return words, false
		}
		var w strings.Builder
		var quote byte
		for {
			if i >= len(s) {
				if quote != 0 {
					return words, true
				}
				break
			}
			c := s[i]
			if c == '\\' && !retainEscape {
				// An escape, inside quotes or out.
				if i+1 >= len(s) {
					return words, true
				}
				n, ok := unescapeOne(s[i+1:], mode)
				if !ok {
					return words, true
				}
				w.WriteString(n.text)
				i += 1 + n.width
				continue
			}
			if quote != 0 {
				if c == quote {
					quote = 0
				} else {
					w.WriteByte(c)
				}
				i++
				continue
			}
			if unquote && (c == '\'' || c == '"') {
				quote = c
				i++
				continue
			}
			if strings.IndexByte(whitespace, c) >= 0 {
				break
			}
			w.WriteByte(c)
			i++
		}
		words = append(words, w.String())
	}
}

type unescaped struct {
	text  string
	width int
}

// unescapeOne decodes what follows a backslash: the next character as it
// is, or, in wordsProperty mode, a C escape (cunescape_one()); false for
// an escape systemd refuses there.
func unescapeOne(s string, mode int) (unescaped, bool) {
	if mode != wordsProperty {
		return unescaped{s[:1], 1}, true
	}
	simple := map[byte]string{'a': "\a", 'b': "\b", 'f': "\f", 'n': "\n", 'r': "\r", 't': "\t", 'v': "\v", '\\': "\\", '"': "\"", '\'': "'", 's': " "}
	if t, ok := simple[s[0]]; ok {
		return unescaped{t, 1}, true
	}
	hex := func(t string, n int) (rune, bool) {
		if len(t) < n {
			return 0, false
		}
		var r rune
		for i := 0; i < n; i++ {
			c := t[i]
			var v byte
			switch {
			case c >= '0' && c <= '9':
				v = c - '0'
			case c >= 'a' && c <= 'f':
				v = c - 'a' + 10
			case c >= 'A' && c <= 'F':
				v = c - 'A' + 10
			default:
				return 0, false
			}
			r = r<<4 | rune(v)
		}
		return r, true
	}
	switch s[0] {
	case 'x':
		if r, ok := hex(s[1:], 2); ok && r != 0 {
			return unescaped{string([]byte{byte(r)}), 3}, true
		}
	case 'u':
		if r, ok := hex(s[1:], 4); ok && r != 0 && utf8.ValidRune(r) {
			return unescaped{string(r), 5}, true
		}
	case 'U':
		if r, ok := hex(s[1:], 8); ok && r != 0 && utf8.ValidRune(r) {
			return unescaped{string(r), 9}, true
		}
	case '0', '1', '2', '3', '4', '5', '6', '7':
		if len(s) >= 3 {
			var r int
			for i := 0; i < 3; i++ {
				if s[i] < '0' || s[i] > '7' {
					return unescaped{}, false
				}
				r = r*8 + int(s[i]-'0')
			}
			if r != 0 && r <= 255 {
				return unescaped{string([]byte{byte(r)}), 3}, true
			}
		}
	}
	return unescaped{}, false
}

// parseBoolean is systemd's parse_boolean(): ok false for anything else,
// where config_parse_bool() keeps the value the setting had (its default,
// or what an earlier file set).
func parseBoolean(v string) (b, ok bool) {
	switch strings.ToLower(v) {
	case "1", "yes", "y", "true", "t", "on":
		return true, true
	case "0", "no", "n", "false", "f", "off":
		return false, true
	}
	return false, false
}
