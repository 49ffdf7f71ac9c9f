package demotools

import (
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"
)

// defaultCustomer is the customer get_policy_number answers for when no name is given, as when
// a user asks "我的保单号是多少" ("what is my policy number").
const defaultCustomer = "张三"

// policyProduct is an insurance product a demo policy can be for.
type policyProduct struct {
	Name       string
	Kind       string
	SumInsured []int // CNY, one is picked
	Premium    [2]int
}

var policyProducts = []policyProduct{
	{"安心住院医疗险", "medical", []int{2000000, 4000000}, [2]int{300, 1800}},
	{"守护重疾险", "critical_illness", []int{300000, 500000, 800000}, [2]int{3200, 9800}},
	{"畅行综合意外险", "accident", []int{500000, 1000000}, [2]int{150, 600}},
	{"福寿年金保险", "annuity", []int{200000, 500000}, [2]int{10000, 50000}},
	{"家庭定期寿险", "term_life", []int{1000000, 2000000, 3000000}, [2]int{900, 4200}},
	{"安居家财险", "property", []int{800000, 1500000}, [2]int{260, 980}},
}

var policyAgents = []string{"刘洋", "陈静", "王磊", "赵敏", "孙浩", "周婷"}

// policy is a customer's demo policy, derived from the holder's name alone.
type policy struct {
	Number     string
	Holder     string
	Product    policyProduct
	SumInsured int
	Premium    int
	Monthly    bool
	Effective  time.Time
	Status     string
	Agent      string
}

// policyStatuses are the statuses a policy can have, active most often.
var policyStatuses = []string{"active", "active", "active", "active", "active", "active", "pending", "pending", "lapsed", "suspended"}

var policyStatusText = map[string]string{
	"active":    "有效",
	"pending":   "待缴费（宽限期内）",
	"lapsed":    "已失效",
	"suspended": "已中止（理赔审核中）",
}

// graceDays is how long an unpaid premium keeps a policy in force.
const graceDays = 60

func policyFor(holder string) policy {
	r := seeded("policy", holder)
	p := policy{Holder: holder, Product: pick(r, policyProducts), Agent: pick(r, policyAgents)}
	p.SumInsured = pick(r, p.Product.SumInsured)
	p.Premium = between(r, p.Product.Premium[0], p.Product.Premium[1]) / 10 * 10
	p.Effective = time.Date(between(r, 2018, 2024), time.Month(between(r, 1, 12)), between(r, 1, 28), 0, 0, 0, 0, demoZone)
	p.Number = fmt.Sprintf("PN-%d-%07d", p.Effective.Year(), r.IntN(10_000_000))
	p.Status = pick(r, policyStatuses)
	p.Monthly = p.Status == "pending" || r.IntN(3) == 0
	return p
}

// due returns the k-th premium due date (k = 0 is the effective date).
func (p policy) due(k int) time.Time {
	if p.Monthly {
		return p.Effective.AddDate(0, k, 0)
	}
	return p.Effective.AddDate(k, 0, 0)
}

// lastDue returns the latest due date on or before t, or the effective date.
func (p policy) lastDue(t time.Time) time.Time {
	last := p.Effective
	for k := 1; !p.due(k).After(t); k++ {
		last = p.due(k)
	}
	return last
}

// nextDue returns the first due date after t.
func (p policy) nextDue(t time.Time) time.Time {
	k := 0
	for !p.due(k).After(t) {
		k++
	}
	return p.due(k)
}

// holderName returns the customer name among the arguments (name, customer_name, or the
// first capture group of the routing regex), and which argument held it.
func holderName(a args) (string, string, error) {
	name, field, err := a.firstStr("name", "customer_name", "holder", "match_1")
	if err != nil {
		return "", "", err
	}
	if utf8.RuneCountInString(name) > 64 {
		return "", "", badArg(field, "a person's name of at most 64 characters", "too long")
	}
	return name, field, nil
}

func (p policy) premium() map[string]any {
	freq := "annual"
	if p.Monthly {
		freq = "monthly"
	}
	amount := p.Premium
	if p.Monthly {
		amount = max(10, p.Premium/12)
	}
	return map[string]any{"amount": amount, "currency": "CNY", "frequency": freq}
}

// policyNumber is get_policy_number: the policy number of the named customer, or of the demo
// customer when no name is given.
func (s *server) policyNumber(_ *http.Request, a args) (any, error) {
	name, _, err := holderName(a)
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	if name == "" {
		name = defaultCustomer
		out["note"] = "no customer name given; answering for the signed-in demo customer " + defaultCustomer
	}
	p := policyFor(name)
	out["policy_number"] = p.Number
	out["holder"] = p.Holder
	out["product"] = p.Product.Name
	out["product_type"] = p.Product.Kind
	out["effective_date"] = p.Effective.Format(dateLayout)
	return out, nil
}

// policyStatus is get_policy_status: the state of the named customer's policy.
func (s *server) policyStatus(_ *http.Request, a args) (any, error) {
	name, _, err := holderName(a)
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, missingArg("name", "the policy holder's name, e.g. \"王五\" (or match_1 captured by the route's intent_regex)")
	}
	p := policyFor(name)
	today := s.today()
	out := map[string]any{
		"policy_number":   p.Number,
		"holder":          p.Holder,
		"product":         p.Product.Name,
		"status":          p.Status,
		"status_text":     policyStatusText[p.Status],
		"effective_date":  p.Effective.Format(dateLayout),
		"sum_insured":     map[string]any{"amount": p.SumInsured, "currency": "CNY"},
		"premium":         p.premium(),
		"service_agent":   p.Agent,
		"service_hotline": "95500",
	}
	switch p.Status {
	case "active", "suspended":
		out["next_premium_date"] = p.nextDue(today).Format(dateLayout)
		if p.Status == "suspended" {
			out["reason"] = "a claim is under review; premiums are paused until it is settled"
		}
	case "pending":
		due := p.lastDue(today)
		out["unpaid_premium_date"] = due.Format(dateLayout)
		out["grace_period_ends"] = due.AddDate(0, 0, graceDays).Format(dateLayout)
	case "lapsed":
		due := p.lastDue(today.AddDate(0, 0, -graceDays))
		out["unpaid_premium_date"] = due.Format(dateLayout)
		out["lapsed_on"] = due.AddDate(0, 0, graceDays).Format(dateLayout)
		out["reinstatement_deadline"] = due.AddDate(2, 0, graceDays).Format(dateLayout)
	}
	return out, nil
}
