# One image with every Hermes binary: hermes (up, nats, demo-tools, route…), router, toolworker,
# gateway. docker-compose.yml runs each as its own service.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/...

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/
COPY --from=build /out/ /usr/local/bin/
COPY deploy/routes.yaml /etc/hermes/routes.yaml
ENV PATH=/usr/local/bin
USER 65532:65532
ENTRYPOINT []
CMD ["hermes", "--help"]
