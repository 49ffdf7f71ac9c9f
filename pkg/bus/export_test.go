package bus

// OnRepartitionStep makes Repartition call f at each step a request sent meanwhile could race
// with ("before the transform", "after the transform"), until the test ends.
func OnRepartitionStep(cleanup func(func()), f func(step string)) {
	repartitionStep = f
	cleanup(func() { repartitionStep = func(string) {} })
}

// OnRestreamStep makes Restream call f after each step a run may be cut short at ("copied",
// "switched"); an error f returns ends the run there. Until the test ends.
func OnRestreamStep(cleanup func(func()), f func(step string) error) {
	restreamStep = f
	cleanup(func() { restreamStep = func(string) error { return nil } })
}
