module cyclone.example

go 1.21

require github.com/cyclone-workflows/cyclone/sdks/go v0.0.0

replace github.com/cyclone-workflows/cyclone/sdks/go => ../../sdks/go
