package bus

// OnRepartitionStep makes Repartition call f at each step a request sent meanwhile could race
// with ("before the transform", "after the transform"), until the test ends.
func OnRepartitionStep(cleanup func(func()), f func(step string)) {
	repartitionStep = f
	cleanup(func() { repartitionStep = func(string) {} })
}
