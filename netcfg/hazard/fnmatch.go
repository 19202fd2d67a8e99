package hazard

import (
	"strings"
	"unicode"
)

// fnmatch is glibc's fnmatch(pattern, s, flags) with the flags systemd's
// matching passes (0, or FNM_CASEFOLD for Host=): '*' and '?' match any
// character ('/' and a leading '.' included), a bracket expression takes
// '!' or '^' to negate, ranges and [:class:], a backslash quotes the next
// character. An unterminated bracket matches a literal '['. Go's
// path.Match differs ('^' only, '/' special, an error for a bad
// pattern), hence this.
func fnmatch(pattern, s string, fold bool) bool {
	if fold {
		pattern, s = strings.ToLower(pattern), strings.ToLower(s)
	}
	return match([]rune(pattern), []rune(s))
}

func match(p, s []rune) bool {
	for len(p) > 0 {
		switch p[0] {
		case '*':
			for len(p) > 0 && p[0] == '*' {
				p = p[1:]
			}
			if len(p) == 0 {
				return true
			}
			for i := 0; i <= len(s); i++ {
				if match(p, s[i:]) {
					return true
				}
			}
			return false
		case '?':
			if len(s) == 0 {
				return false
			}
			p, s = p[1:], s[1:]
		case '[':
			if len(s) == 0 {
				return false
			}
			ok, n, valid := bracket(p, s[0])
			if !valid {
				// A literal '['.
				if s[0] != '[' {
					return false
				}
				p, s = p[1:], s[1:]
				continue
			}
			if !ok {
				return false
			}
			p, s = p[n:], s[1:]
		case '\\':
			if len(p) > 1 {
				p = p[1:]
			}
			if len(s) == 0 || s[0] != p[0] {
				return false
			}
			p, s = p[1:], s[1:]
		default:
			if len(s) == 0 || s[0] != p[0] {
				return false
			}
			p, s = p[1:], s[1:]
		}
	}
	return len(s) == 0
}

// bracket matches c against the bracket expression at the start of p: the
// result, the expression's length and whether it is terminated.
func bracket(p []rune, c rune) (matched bool, n int, valid bool) {
	i := 1
	negate := false
	if i < len(p) && (p[i] == '!' || p[i] == '^') {
		negate = true
		i++
	}
	first := true
	for i < len(p) {
		if p[i] == ']' && !first {
			return matched != negate, i + 1, true
		}
		first = false
		if p[i] == '[' && i+1 < len(p) && p[i+1] == ':' {
			if end := indexRunes(p[i+2:], ':', ']'); end >= 0 {
				if classMatch(string(p[i+2:i+2+end]), c) {
					matched = true
				}
				i += 2 + end + 2
				continue
			}
		}
		lo := p[i]
		if lo == '\\' && i+1 < len(p) {
			i++
			lo = p[i]
		}
		i++
		hi := lo
		if i+1 < len(p) && p[i] == '-' && p[i+1] != ']' {
			hi = p[i+1]
			if hi == '\\' && i+2 < len(p) {
				hi = p[i+2]
				i++
			}
			i += 2
		}
		if lo <= c && c <= hi {
			matched = true
		}
	}
	return false, 0, false
}

func classMatch(class string, c rune) bool {
	switch class {
	case "alnum":
		return unicode.IsLetter(c) || unicode.IsDigit(c)
	case "alpha":
		return unicode.IsLetter(c)
	case "blank":
		return c == ' ' || c == '\t'
	case "cntrl":
		return unicode.IsControl(c)
	case "digit":
		return c >= '0' && c <= '9'
	case "graph":
		return unicode.IsGraphic(c) && c != ' '
	case "lower":
		return unicode.IsLower(c)
	case "print":
		return unicode.IsPrint(c)
	case "punct":
		return unicode.IsPunct(c) || unicode.IsSymbol(c)
	case "space":
		return unicode.IsSpace(c)
	case "upper":
		return unicode.IsUpper(c)
	case "xdigit":
		return strings.ContainsRune("0123456789abcdefABCDEF", c)
	}
	return false
}

// indexRunes is the index of the pair a, b in p, -1 when absent.
func indexRunes(p []rune, a, b rune) int {
	for i := 0; i+1 < len(p); i++ {
		if p[i] == a && p[i+1] == b {
			return i
		}
	}
	return -1
}
