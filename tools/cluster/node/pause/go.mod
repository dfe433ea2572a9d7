module llmbench.local/pause

go 1.26
