package bus

// OnRepartitionStep makes Repartition call f at each step a request sent meanwhile could race
// with ("before the transform", "after the transform"), until the test ends.
func OnRepartitionStep(cleanup func(func()), f func(step string)) {
	repartitionStep = f
	cleanup(func() { repartitionStep = func(string) {} })
}

// OnRestreamStep makes b's Restream call f after each step a run may be cut short at
// ("copied", "switched"); an error f returns ends the run there.
func OnRestreamStep(b *Bus, f func(step string) error) { b.onRestreamStep = f }
