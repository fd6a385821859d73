# lines of 16383, 16384 and 16385 bytes (without their newline), then one
# whose 16384-byte cut falls inside a 2-byte UTF-8 character (é)
awk 'BEGIN{for(i=0;i<16383;i++) printf "a"; print ""}'
awk 'BEGIN{for(i=0;i<16384;i++) printf "b"; print ""}'
awk 'BEGIN{for(i=0;i<16385;i++) printf "c"; print ""}'
awk 'BEGIN{for(i=0;i<16383;i++) printf "d"; printf "\303\251"; print "end"}'
