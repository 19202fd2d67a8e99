package kube

import "testing"

func TestPIAPortAnnotation(t *testing.T) {
	for _, tt := range []struct {
		ports map[string]int
		want  string
	}{
		{nil, ""},
		{map[string]int{"wg-pia": 47047}, "47047"},
		{map[string]int{"wg-pia2": 51000, "wg-pia": 47047}, "wg-pia=47047,wg-pia2=51000"},
	} {
		d := desiredState(Config{Enabled: true}, Snapshot{PIAPorts: tt.ports}, hysteresis{})
		if got, ok := d.Annotations[AnnotationPIAPort]; got != tt.want || ok != (tt.want != "") {
			t.Errorf("%v: annotation %q (present %v), want %q", tt.ports, got, ok, tt.want)
		}
	}
}
