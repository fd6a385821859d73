# max-size=20k: the 49152-byte line's records are split across rotated files
echo "before"
awk 'BEGIN{for(i=0;i<4915;i++) printf "%09d|", i; printf "ab\n"}'
echo "after"
