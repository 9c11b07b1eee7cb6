module tianji.local/cluster/probe

go 1.26.0
