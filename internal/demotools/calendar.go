package demotools

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// defaultActivityCity is the city calendar_query answers for when none is given.
const defaultActivityCity = "北京"

// activityKind is one kind of activity calendar_query may suggest: where it happens (a %s
// takes the city), when it may start (hours) and how long and how dear it is.
type activityKind struct {
	Name     string
	Places   []string
	Start    [2]int // earliest and latest starting hour
	Duration [2]int // minutes
	Price    [2]int // CNY; 0 is free
}

// activityTypes are calendar_query's types, each with its name in answers and its list.
var activityTypes = map[string]struct {
	Text  string
	Kinds []activityKind
}{
	"indoor_activities": {"室内活动", []activityKind{
		{"逛博物馆", []string{"%s博物馆", "%s自然博物馆", "%s科技馆"}, [2]int{9, 14}, [2]int{90, 180}, [2]int{0, 60}},
		{"室内攀岩", []string{"岩时攀岩馆", "%s攀岩中心"}, [2]int{10, 19}, [2]int{90, 150}, [2]int{98, 168}},
		{"看话剧", []string{"%s人民艺术剧院", "%s话剧艺术中心", "蜂巢剧场"}, [2]int{14, 19}, [2]int{120, 150}, [2]int{180, 480}},
		{"看展览", []string{"%s美术馆", "%s当代艺术中心", "%s艺术中心"}, [2]int{10, 16}, [2]int{60, 120}, [2]int{0, 150}},
		{"泡书店", []string{"%s图书大厦", "单向空间", "钟书阁", "西西弗书店"}, [2]int{10, 18}, [2]int{60, 150}, [2]int{0, 0}},
		{"密室逃脱", []string{"迷城密室", "X先生密室", "%s沉浸剧场"}, [2]int{13, 20}, [2]int{60, 90}, [2]int{128, 228}},
		{"看电影", []string{"万达影城", "百老汇影城", "%s IMAX 影城"}, [2]int{11, 21}, [2]int{100, 150}, [2]int{45, 90}},
		{"室内游泳", []string{"%s游泳馆", "%s全民健身中心"}, [2]int{8, 19}, [2]int{60, 90}, [2]int{30, 60}},
		{"陶艺体验", []string{"泥巴工坊", "%s手作陶艺馆"}, [2]int{10, 17}, [2]int{90, 150}, [2]int{128, 198}},
	}},
	"outdoor_activities": {"户外活动", []activityKind{
		{"公园骑行", []string{"%s城市森林公园", "%s滨江绿道", "%s环湖骑行道"}, [2]int{7, 16}, [2]int{90, 180}, [2]int{0, 30}},
		{"爬山", []string{"%s近郊登山步道", "%s郊野公园", "%s国家森林公园"}, [2]int{6, 10}, [2]int{180, 300}, [2]int{0, 30}},
		{"城墙徒步", []string{"%s古城墙", "%s明城墙遗址公园"}, [2]int{8, 16}, [2]int{90, 150}, [2]int{0, 54}},
		{"湖边野餐", []string{"%s湖滨公园", "%s植物园草坪"}, [2]int{11, 14}, [2]int{120, 180}, [2]int{0, 10}},
		{"逛露天市集", []string{"%s周末创意市集", "%s文创园露天市集"}, [2]int{10, 17}, [2]int{60, 120}, [2]int{0, 0}},
		{"划船", []string{"%s公园游船码头", "%s湖畔游船码头"}, [2]int{9, 16}, [2]int{45, 90}, [2]int{60, 150}},
		{"放风筝", []string{"%s中央公园", "%s市民广场"}, [2]int{9, 16}, [2]int{60, 120}, [2]int{0, 40}},
		{"户外露营", []string{"%s郊野露营地", "%s湿地公园营地"}, [2]int{10, 15}, [2]int{240, 360}, [2]int{88, 298}},
		{"城市漫步", []string{"%s老城区", "%s历史文化街区"}, [2]int{9, 17}, [2]int{90, 150}, [2]int{0, 0}},
	}},
}

// activityTypeNames lists calendar_query's types, for errors.
const activityTypeNames = `"indoor_activities" or "outdoor_activities"`

// activity is one suggestion of calendar_query.
type activity struct {
	Name            string `json:"name"`
	Place           string `json:"place"`
	StartTime       string `json:"start_time"`
	DurationMinutes int    `json:"duration_minutes"`
	PriceCNY        int    `json:"price_cny"`
}

// calendarQuery is calendar_query: three to five activities of a type (indoor or outdoor) in a
// city (default 北京) on a date (default today), earliest first.
func (s *server) calendarQuery(_ *http.Request, a args) (any, error) {
	typ, ok, err := a.str("type")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, missingArg("type", activityTypeNames)
	}
	kind, known := activityTypes[typ]
	if !known {
		return nil, badArg("type", activityTypeNames, fmt.Sprintf("%s is not one of them", quote(typ)))
	}
	city, day, err := s.cityAndDay(a, defaultActivityCity)
	if err != nil {
		return nil, err
	}
	date := day.Format(dateLayout)

	r := seeded("calendar", typ, city, date)
	n := between(r, 3, 5)
	list := make([]activity, 0, n)
	for _, i := range r.Perm(len(kind.Kinds))[:n] {
		k := kind.Kinds[i]
		place := pick(r, k.Places)
		if strings.Contains(place, "%s") {
			place = fmt.Sprintf(place, city)
		}
		price := between(r, k.Price[0], k.Price[1])
		if price > 10 {
			price -= price % 5 // prices end in 0 or 5
		}
		list = append(list, activity{
			Name:            k.Name,
			Place:           place,
			StartTime:       fmt.Sprintf("%02d:%02d", between(r, k.Start[0], k.Start[1]), 30*r.IntN(2)),
			DurationMinutes: between(r, k.Duration[0]/15, k.Duration[1]/15) * 15,
			PriceCNY:        price,
		})
	}
	slices.SortStableFunc(list, func(x, y activity) int { return cmp.Compare(x.StartTime, y.StartTime) })
	names := make([]string, len(list))
	for i, act := range list {
		names[i] = act.Name
	}
	return map[string]any{
		"city":       city,
		"date":       date,
		"type":       typ,
		"activities": list,
		"summary":    fmt.Sprintf("%s %s 的%s推荐：%s。", city, date, kind.Text, strings.Join(names, "、")),
		"source":     "hermes demo calendar",
	}, nil
}
