package config

import "slices"

// adoptLabels checks kubernetes.adoptLabels: each key once, and each a
// label nodeagent keeps (a key of kubernetes.labels or of
// kubernetes.conditionalLabels), since adopting a label means nodeagent
// owns it from then on, and removes it when it leaves the config.
func (v *validator) adoptLabels(k Kubernetes) {
	seen := map[string]string{}
	for i, key := range k.AdoptLabels {
		p := indexPath("kubernetes.adoptLabels", i)
		if key == "" {
			v.errorf(p, "empty; list keys of kubernetes.labels or kubernetes.conditionalLabels")
			continue
		}
		if first, dup := seen[key]; dup {
			v.errorf(p, "duplicate %q; first at %s", key, v.where(first))
			continue
		}
		seen[key] = p
		if hasKey(k.Labels, key) || slices.ContainsFunc(k.ConditionalLabels, func(cl ConditionalLabel) bool { return cl.Key == key }) {
			continue
		}
		v.errorf(p, "%q is neither a key of kubernetes.labels nor of kubernetes.conditionalLabels; only a label nodeagent keeps can be adopted", key)
	}
}
