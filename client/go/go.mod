// The Go client of moebatchd (README.md). The requirements are the versions Debian 12 ships
// (golang-google-grpc-dev, golang-google-protobuf-dev, golang-github-golang-protobuf-1-5-dev and
// their dependencies): build.sh builds against /usr/share/gocode through a vendor/ of symlinks,
// offline, and warns when an installed package no longer matches its line here. Two are older
// than a dependency asks (x/net v0.7.0 wants x/sys v0.5.0, grpc v1.33.3 genproto 20200526): with a
// module proxy, minimal version selection takes the newer ones.
module moebatch/client/go

go 1.19

require (
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)

require (
	github.com/golang/protobuf v1.5.2 // indirect
	golang.org/x/net v0.7.0 // indirect
	golang.org/x/sys v0.3.0 // indirect
	golang.org/x/text v0.7.0 // indirect
	google.golang.org/genproto v0.0.0-20200413115906-b5235f65be36 // indirect
)
