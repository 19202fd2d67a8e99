package api

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestNotDegradingDocumented holds nodeagentctl(1) to NotDegrading, the
// one place in the code that says which conditions leave the node not
// degraded while False: the CONDITIONS section's sentence "degraded while
// any condition but A, B and C is False" names exactly that set, and no
// entry of another condition says it does not degrade the node (issue 45:
// PortDelivered's entry said so while the code let it degrade nothing,
// and the sentence above it said otherwise).
func TestNotDegradingDocumented(t *testing.T) {
	page, err := os.ReadFile("../../docs/nodeagentctl.1")
	if err != nil {
		t.Fatal(err)
	}
	_, sect, ok := strings.Cut(string(page), "\n.SH CONDITIONS\n")
	if !ok {
		t.Fatal("docs/nodeagentctl.1 has no CONDITIONS section")
	}
	sect, _, _ = strings.Cut(sect, "\n.SH ")
	m := regexp.MustCompile(`(?s)\.B degraded\nwhile any condition but ([A-Za-z, ]+?) is False\.`).FindStringSubmatch(sect)
	if m == nil {
		t.Fatal(`docs/nodeagentctl.1's CONDITIONS has no ".B degraded" / "while any condition but A, B and C is False." (packaging/man/nodeagentctl.1.in)`)
	}
	var named []string
	for _, part := range strings.Split(strings.ReplaceAll(m[1], " and ", ", "), ",") {
		if p := strings.TrimSpace(part); p != "" {
			named = append(named, p)
		}
	}
	slices.Sort(named)
	want := slices.Sorted(slices.Values(NotDegrading))
	if !slices.Equal(named, want) {
		t.Errorf("docs/nodeagentctl.1 says the node is degraded while any condition but %q is False; api.NotDegrading is %q", named, want)
	}

	// Each entry (".TP\n.B Type\n...") agrees: one that says it does not
	// degrade the node is of NotDegrading, and one that says it degrades
	// it is not.
	entries := strings.Split(sect, "\n.TP\n.B ")[1:]
	if len(entries) < len(NotDegrading) {
		t.Fatalf("%d condition entries under CONDITIONS", len(entries))
	}
	notRe := regexp.MustCompile(`(?i)(does not make the node\s+degraded|neither degrades|not\s+degrade)`)
	yesRe := regexp.MustCompile(`(?i)(\bdegrades the node|makes the node\s+degraded|which degrades)`)
	for _, e := range entries {
		typ, body, _ := strings.Cut(e, "\n")
		body = strings.ReplaceAll(body, "\n", " ")
		switch {
		case notRe.MatchString(body) && Degrades(typ):
			t.Errorf("docs/nodeagentctl.1: %s's entry says it does not degrade the node, but api.Degrades(%s) is true", typ, typ)
		case yesRe.MatchString(body) && !Degrades(typ):
			t.Errorf("docs/nodeagentctl.1: %s's entry says it degrades the node, but it is in api.NotDegrading", typ)
		}
	}
}

// TestDegrading: the degrading conditions are the False ones outside
// NotDegrading; Unknown and True degrade nothing.
func TestDegrading(t *testing.T) {
	s := Status{Conditions: []Condition{
		{Type: CondReady, Status: False},
		{Type: CondLabelsSynced, Status: False},
		{Type: CondCoexistence, Status: False},
		{Type: CondPortDelivered, Status: Unknown},
		{Type: CondTunnelHealthy, Status: True},
	}}
	if d := s.Degrading(); len(d) != 0 {
		t.Errorf("degrading: %+v", d)
	}
	s.Conditions = append(s.Conditions, Condition{Type: CondPortDelivered, Status: False}, Condition{Type: "SomethingNew", Status: False})
	if d := s.Degrading(); len(d) != 2 || d[0].Type != CondPortDelivered || d[1].Type != "SomethingNew" {
		t.Errorf("degrading: %+v; want PortDelivered and a condition type no list names", d)
	}
}
