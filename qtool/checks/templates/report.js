(function(){
  var table=document.getElementById('quantized'); if(!table) return;
  var body=table.tBodies[0], dir={};
  var first={order:1, amax:-1, clipped:-1, tsqnr:1, sqnr:1};
  function val(tr,key){var s=tr.getAttribute('data-'+key); return s===''||s===null?null:parseFloat(s);}
  function sortBy(key){
    var d=dir[key]===undefined?first[key]:-dir[key]; dir={}; dir[key]=d;
    var trs=Array.prototype.slice.call(body.rows);
    trs.sort(function(a,b){
      var x=val(a,key), y=val(b,key);
      if(x===null&&y===null) return val(a,'order')-val(b,'order');
      if(x===null) return 1; if(y===null) return -1;
      if(x===y) return val(a,'order')-val(b,'order');
      return x<y?-d:d;
    });
    trs.forEach(function(tr){body.appendChild(tr);});
    Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th){
      var k=th.getAttribute('data-key'); if(!k) return;
      th.setAttribute('aria-sort', k===key?(d>0?'ascending':'descending'):'none');
      th.querySelector('span').textContent = k===key?(d>0?' \u25B2':' \u25BC'):'';
    });
  }
  Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th){
    var k=th.getAttribute('data-key'); if(k) th.addEventListener('click',function(){sortBy(k);});
  });
  var m=/sort=(\w+)/.exec(location.hash); if(m&&first[m[1]]!==undefined) sortBy(m[1]);
})();
