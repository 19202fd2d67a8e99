package config

import "strings"

// suggest returns the candidate closest to the unknown key got, or "" if
// none is close enough to be a plausible typo.
func suggest(got string, candidates []string) string {
	best, bestDist := "", -1
	g := strings.ToLower(got)
	for _, c := range candidates {
		d := editDistance(g, strings.ToLower(c))
		if bestDist < 0 || d < bestDist {
			best, bestDist = c, d
		}
	}
	// Allow one edit per three characters, at least one and at most three,
	// so "mtuu" suggests "mtu" but "up" does not suggest "id".
	limit := min(max(len(got)/3, 1), 3)
	if bestDist < 0 || bestDist > limit {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b,
// in bytes: insertions, deletions, substitutions and swaps of two adjacent
// bytes, each one edit, so "tabel" is one edit from "table" (Levenshtein
// counts two, too many for a five-letter word).
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return max(len(a), len(b)) // not a typo of a field name; skip the work
	}
	// Three rows: the one before last, for swaps.
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
