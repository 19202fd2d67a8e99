package owners

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// maxSources bounds the files ifupdown's source lines lead to.
const maxSources = 256

// ifupdown finds the stanzas of /etc/network/interfaces (and the files
// its source and source-directory lines name) that bring the links up:
// their iface block, and an auto or allow-* line naming them alone.
func (r *reader) ifupdown() {
	seen := map[string]bool{}
	var walk func(f string, depth int)
	walk = func(f string, depth int) {
		if seen[f] || len(seen) >= maxSources || depth > 8 {
			return
		}
		seen[f] = true
		b, ok := r.read(f)
		if !ok {
			return
		}
		lines := strings.Split(string(b), "\n")
		type block struct {
			name        string
			first, last int
		}
		var cur *block
		flush := func() {
			if cur != nil && r.links[cur.name] {
				r.out = append(r.out, Owner{Kind: Ifupdown, Link: cur.name, File: r.nodePath(f), Makes: true,
					First: cur.first, Last: cur.last, Role: fmt.Sprintf("the iface %s stanza", cur.name)})
			}
			cur = nil
		}
		for i, raw := range lines {
			n := i + 1
			s := strings.TrimSpace(raw)
			if s == "" || strings.HasPrefix(s, "#") {
				continue
			}
			fields := strings.Fields(s)
			switch kw := fields[0]; {
			case kw == "iface":
				flush()
				if len(fields) > 1 {
					cur = &block{name: fields[1], first: n, last: n}
				}
			case kw == "auto" || strings.HasPrefix(kw, "allow-") || kw == "mapping" || kw == "rename":
				flush()
				for _, l := range fields[1:] {
					if !r.links[l] || kw == "mapping" || kw == "rename" {
						continue
					}
					o := Owner{Kind: Ifupdown, Link: l, File: r.nodePath(f), First: n, Last: n,
						Role: fmt.Sprintf("the %s line that brings %s up at boot", kw, l)}
					if len(fields) > 2 {
						o.Manual = true
						o.Role = fmt.Sprintf("line %d: %s names %s and %s: take %s out of it", n, kw, l, strings.Join(slices.DeleteFunc(slices.Clone(fields[1:]), func(x string) bool { return x == l }), " "), l)
					}
					r.out = append(r.out, o)
				}
			case kw == "source" || kw == "source-directory":
				flush()
				for _, arg := range fields[1:] {
					p := arg
					if !filepath.IsAbs(p) {
						p = filepath.Join("/etc/network", p)
					}
					// Under the directory standing for /etc.
					if rel, ok := strings.CutPrefix(p, "/etc/"); ok {
						p = filepath.Join(r.etc, rel)
					}
					if kw == "source-directory" {
						for _, g := range r.list(p) {
							if base := filepath.Base(g); strings.Trim(base, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == "" {
								walk(g, depth+1)
							}
						}
						continue
					}
					matches, _ := filepath.Glob(p)
					slices.Sort(matches)
					for _, m := range matches {
						walk(m, depth+1)
					}
				}
			default:
				if cur != nil {
					cur.last = n // an option of the iface block
				}
			}
		}
		flush()
	}
	walk(filepath.Join(r.etc, "network", "interfaces"), 0)
}
