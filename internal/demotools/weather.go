package demotools

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// southernCities are the cities whose seasons weather_search turns around.
var southernCities = map[string]bool{
	"sydney": true, "melbourne": true, "brisbane": true, "perth": true, "auckland": true,
	"cape town": true, "johannesburg": true, "buenos aires": true, "santiago": true,
	"são paulo": true, "sao paulo": true, "rio de janeiro": true, "lima": true,
	"悉尼": true, "墨尔本": true, "布里斯班": true, "珀斯": true, "奥克兰": true,
	"开普敦": true, "布宜诺斯艾利斯": true, "圣地亚哥": true, "圣保罗": true,
}

type weatherKind struct {
	Condition string
	Text      string
	Rain      [2]int // chance of precipitation, percent
}

var (
	weatherDry = []weatherKind{
		{"sunny", "晴", [2]int{0, 10}},
		{"partly_cloudy", "多云", [2]int{5, 20}},
		{"cloudy", "阴", [2]int{10, 30}},
		{"haze", "霾", [2]int{0, 10}},
	}
	weatherWet = []weatherKind{
		{"light_rain", "小雨", [2]int{55, 75}},
		{"showers", "阵雨", [2]int{45, 70}},
		{"moderate_rain", "中雨", [2]int{70, 90}},
		{"thunderstorm", "雷阵雨", [2]int{60, 85}},
	}
	weatherSnow = weatherKind{"snow", "小雪", [2]int{60, 85}}
	windDirs    = []string{"N", "NE", "E", "SE", "S", "SW", "W", "NW"}
)

// cityAndDay reads the arguments city (at most 80 characters; required when fallback is
// empty, else fallback) and date (YYYY-MM-DD, default today).
func (s *server) cityAndDay(a args, fallback string) (string, time.Time, error) {
	city, ok, err := a.str("city")
	if err != nil {
		return "", time.Time{}, err
	}
	switch {
	case !ok && fallback == "":
		return "", time.Time{}, missingArg("city", "a city name, e.g. \"上海\" or \"Berlin\"")
	case !ok:
		city = fallback
	}
	if utf8.RuneCountInString(city) > 80 {
		return "", time.Time{}, badArg("city", "a city name of at most 80 characters", "too long")
	}
	day, ok, err := a.date("date")
	if err != nil {
		return "", time.Time{}, err
	}
	if !ok {
		day = s.today()
	}
	return city, day, nil
}

// weatherSearch is weather_search: the forecast for a city on a date (default today).
func (s *server) weatherSearch(_ *http.Request, a args) (any, error) {
	city, day, err := s.cityAndDay(a, "")
	if err != nil {
		return nil, err
	}
	date := day.Format(dateLayout)

	// The climate is the city's own; the day's weather varies around it.
	climate := seeded("climate", city)
	mean := float64(between(climate, -4, 9)) // offset from a temperate mean
	wetness := between(climate, 15, 45)      // percent of wet days
	r := seeded("weather", city, date)

	phase := 2 * math.Pi * float64(day.YearDay()-15) / 365
	season := -math.Cos(phase) // -1 mid-winter, +1 mid-summer
	if southernCities[strings.ToLower(city)] {
		season = -season
	}
	mid := 14 + 12*season + mean + float64(between(r, -3, 3))
	spread := float64(between(r, 4, 10))
	low, high := int(math.Round(mid-spread/2)), int(math.Round(mid+spread/2))

	kind := pick(r, weatherDry)
	if r.IntN(100) < wetness {
		kind = pick(r, weatherWet)
		if high <= 1 {
			kind = weatherSnow
		}
	}
	rain := between(r, kind.Rain[0], kind.Rain[1])
	wind := between(r, 3, 28)
	if kind.Condition == "thunderstorm" {
		wind += 15
	}
	humidity := between(r, 30, 60)
	if rain > 40 {
		humidity = between(r, 70, 95)
	}
	aqi := between(r, 20, 90)
	if kind.Condition == "haze" {
		aqi = between(r, 150, 260)
	}
	return map[string]any{
		"city":                     city,
		"date":                     date,
		"condition":                kind.Condition,
		"condition_text":           kind.Text,
		"temperature_c":            map[string]int{"low": low, "high": high},
		"precipitation_chance_pct": rain,
		"humidity_pct":             humidity,
		"wind":                     map[string]any{"direction": pick(r, windDirs), "speed_kmh": wind},
		"aqi":                      aqi,
		"summary": fmt.Sprintf("%s %s：%s，%d～%d°C，降水概率 %d%%。",
			city, date, kind.Text, low, high, rain),
		"source": "hermes demo weather",
	}, nil
}
